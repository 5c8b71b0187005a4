# One job per (model, benchmark, config, seed) cell. Each job is a thin client of the
# persistent per-model worker (see safetyrepro.worker) that holds the weights. One rule per
# model and variant (main; bf16 = the precision check on conservative_core), with descending
# priorities, so a model's cells run together and each model is loaded about once per run.

for _rank, _model in enumerate(RUN.models):
    for _variant in ("main", "bf16"):
        _quant = PLAN.quantization(_model, _variant)

        rule:
            name:
                f"cell_{_model}" if _variant == "main" else f"cell_{_variant}_{_model}"
            input:
                unpack(cell_inputs(_model)),
            output:
                rel(
                    PLAN.shard_path(
                        _model, "{benchmark}", "{config}", "{seed}", _variant
                    )
                ),
            log:
                rel(
                    PLAN.results
                    / "logs"
                    / "cells"
                    / _variant
                    / _model
                    / "{benchmark}"
                    / "{config}"
                    / "s{seed}.log"
                ),
            priority: 2 * (len(RUN.models) - _rank) - (_variant != "main")
            conda:
                ENV
            resources:
                gpu=1,
                mem_mb=4000,
            params:
                # the results folder, from the prepared-model marker results/models/<m>.json
                results=lambda w, input: os.path.dirname(os.path.dirname(input.model)),
                config=CONFIG,
                model=_model,
                quant=_quant,
                key=PLAN.worker_key(_model, _quant),
                fingerprint=cell_fingerprint(_model, _variant),
            shell:
                '"$PY" -m safetyrepro.cell_client --results-dir {params.results} --key {params.key}'
                " --quantization {params.quant} --config {params.config} --model {params.model}"
                " --benchmark {wildcards.benchmark} --cell {wildcards.config}"
                " --seed {wildcards.seed} --out {output} > {log} 2>&1"
