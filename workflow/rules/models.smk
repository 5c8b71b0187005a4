# Model preparation: fetch/convert/verify each configured model once.


rule prepare_model:
    output:
        f"{RESULTS}/models/{{model}}.json",
    params:
        fingerprint=lambda w: PLAN.source_fingerprint(w.model),
    log:
        f"{RESULTS}/logs/prepare_model/{{model}}.log",
    shell:
        "{SR} prepare-model --config {CONFIG_PATH} --model {wildcards.model} --marker {output} 2> {log}"
