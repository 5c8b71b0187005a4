# One job per cell: (model, benchmark, config, seed) of a variant (main, or bf16 = the
# precision check on conservative_core; its shards live under shards_bf16/). One rule,
# `cell`, so `--set-resources cell:...` reaches every cell job; its priority is a function
# of the model (Plan.cell_priority), so a model's cells run together and each model is
# loaded about once per run. Each job is a thin client of the persistent per-model worker
# (see safetyrepro.worker) that holds the weights; it passes the worker everything the
# cell reads (config, variant, item and few-shot files) as arguments.


rule cell:
    input:
        subset=lambda w: rel(PLAN.items_path(w.benchmark)),
        fewshot=lambda w: rel(PLAN.fewshot_path(w.benchmark)),
        model=lambda w: rel(PLAN.model_marker(w.model)),
    output:
        f"{RESULTS}/{SHARD_PATTERN}",
    log:
        f"{RESULTS}/logs/cells/{{shards}}/{{model}}/{{benchmark}}/{{config}}/s{{seed}}.log",
    wildcard_constraints:
        shards="|".join(SHARD_ROOTS.values()),
    priority: lambda w: PLAN.cell_priority(w.model, cell_variant(w))
    conda:
        ENV
    resources:
        gpu=1,
        mem_mb=4000,
    params:
        config=CONFIG,
        variant=cell_variant,
        quant=cell_quantization,
        key=lambda w: PLAN.worker_key(w.model, cell_quantization(w)),
        state_root=rel(PLAN.worker_state_root),
        idle=PLAN.worker_idle_timeout,
        timeout=PLAN.cell_timeout,
        device_wait=PLAN.device_wait,
        fingerprint=lambda w: PLAN.cell_fingerprint(
            w.model, w.benchmark, w.config, int(w.seed), cell_variant(w)
        ),
    shell:
        '"$PY" -m safetyrepro.cell_client --config {params.config:q} --model {wildcards.model:q}'
        " --variant {params.variant:q} --quantization {params.quant:q} --benchmark {wildcards.benchmark:q}"
        " --cell {wildcards.config:q} --seed {wildcards.seed:q} --items {input.subset:q}"
        " --fewshot {input.fewshot:q} --state-root {params.state_root:q} --key {params.key:q}"
        " --idle-timeout {params.idle:q} --timeout {params.timeout:q}"
        " --device-wait {params.device_wait:q} --fingerprint {params.fingerprint:q}"
        " --out {output:q} > {log:q} 2>&1"
