# Model preparation: fetch/convert/verify each configured model once.


rule prepare_model:
    output:
        f"{RESULTS}/models/{{model}}.json",
    params:
        fingerprint=lambda w: PLAN.source_fingerprint(w.model),
    priority: 100  # before any cell, so each model's cells then run back to back
    log:
        f"{RESULTS}/logs/prepare_model/{{model}}.log",
    shell:
        "{SR} prepare-model --config {CONFIG_PATH} --model {wildcards.model} --marker {output} 2> {log}"
