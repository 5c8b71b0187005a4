# Model preparation: fetch/convert/verify each configured model once, before any cell (hub
# downloads happen here, never inside a cell job).


rule prepare_model:
    output:
        f"{RESULTS}/models/{{model}}.json",
    log:
        f"{RESULTS}/logs/prepare_model/{{model}}.log",
    priority: 100  # before any cell, so each model's cells then run back to back
    conda:
        ENV
    params:
        config=CONFIG,
        fingerprint=lambda w: PLAN.fingerprints.source_fingerprint(w.model),
    # stderr (download progress bars, errors) goes to the log AND the console: a 15-18 GB
    # download is visible where the run is watched
    shell:
        '"$PY" -m safetyrepro prepare-model --config {params.config:q} --model {wildcards.model:q}'
        " --marker {output:q} 2> >(tee {log:q} >&2)"
