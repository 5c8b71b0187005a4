# One job per (model, benchmark, config, seed) cell. Each job is a thin client of the
# persistent per-model worker (see safetyrepro.worker) that holds the weights. One rule per
# model, with descending priorities, so a model's cells run together and each model is
# loaded about once per run.

for _rank, _model in enumerate(RUN.models):

    rule:
        name:
            f"cell_{_model}"
        input:
            unpack(cell_inputs(_model)),
        output:
            f"{RESULTS}/shards/{_model}/{{benchmark}}/{{config}}/s{{seed}}.parquet",
        params:
            model=_model,
            quant=PLAN.quantization(_model, "main"),
            key=PLAN.worker_key(_model, PLAN.quantization(_model, "main")),
            fingerprint=cell_fingerprint(_model, "main"),
        priority: 2 * (len(RUN.models) - _rank)
        resources:
            gpu=1,
            mem_mb=4000,
        shell:
            "{CELL} --key {params.key} --quantization {params.quant} --config {CONFIG_PATH} --model {params.model}"
            " --benchmark {wildcards.benchmark} --cell {wildcards.config} --seed {wildcards.seed} --out {output}"

    rule:
        name:
            f"cell_bf16_{_model}"
        input:
            unpack(cell_inputs(_model)),
        output:
            f"{RESULTS}/shards_bf16/{_model}/{{benchmark}}/{{config}}/s{{seed}}.parquet",
        params:
            model=_model,
            quant=PLAN.quantization(_model, "bf16"),
            key=PLAN.worker_key(_model, PLAN.quantization(_model, "bf16")),
            fingerprint=cell_fingerprint(_model, "bf16"),
        priority: 2 * (len(RUN.models) - _rank) - 1
        resources:
            gpu=1,
            mem_mb=4000,
        shell:
            "{CELL} --key {params.key} --quantization {params.quant} --config {CONFIG_PATH} --model {params.model}"
            " --benchmark {wildcards.benchmark} --cell {wildcards.config} --seed {wildcards.seed} --out {output}"
