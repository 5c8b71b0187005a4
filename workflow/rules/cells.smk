# One job per cell: (model, benchmark, config, seed) of a variant (main, or bf16 = the
# precision check on conservative_core; its shards live under shards_bf16/). One rule,
# `cell`, so `--set-resources cell:...` reaches every cell job; its priority is a function
# of the model (Plan.cell_priority), so a model's cells run together and each model is
# loaded about once per run. Each job is a thin client of the persistent per-model worker
# (see safetyrepro.worker) that holds the weights; the rule declares every file the cell
# reads (run config, rules, item subset, few-shot pool, prepared-model marker) and the job
# hands exactly those to the worker, with what the plan resolved (decode group, fingerprint).
#
# On a cluster (profiles/slurm) the cells of one model and variant form the group
# `cells_{model}_{shards}`; --group-components there packs that many cells into one Slurm
# job. `gpu` is scoped `local` in the profile, so each cell is its own layer: a group job asks
# for one GPU, the model's mem_mb and the sum of its cells' minutes (docs/SLURM.md). Inside
# the job (remote_exec) the cells are local jobs of the job's own Snakemake process, not a
# job step each: so the worker the first cell starts stays in the batch step, whose life is
# the job's (with cgroup process tracking a step's leftover processes die with the step).
# Local runs ignore groups (dry runs show them).
CELL_GROUP = None if workflow.remote_exec else "cells_{model}_{shards}"
if workflow.remote_exec:

    localrules:
        cell,


rule cell:
    input:
        # exactly the files the job opens (the run config and rules: ancient, so that only a
        # change of the fingerprint reruns a cell, not a newer file)
        config_path=ancient(CONFIG),
        rules=ancient(RULES),
        subset=lambda w: rel(PLAN.layout.items_path(w.benchmark)),
        fewshot=lambda w: rel(PLAN.layout.fewshot_path(w.benchmark)),
        model=lambda w: rel(PLAN.layout.model_marker(w.model)),
    output:
        f"{RESULTS}/{SHARD_PATTERN}",
    log:
        f"{RESULTS}/logs/cells/{{shards}}/{{model}}/{{benchmark}}/{{config_id}}/s{{seed}}.log",
    wildcard_constraints:
        shards="|".join(SHARD_ROOTS.values()),
    priority: lambda w: PLAN.cell_priority(w.model, cell_variant(w))
    group:
        CELL_GROUP
    conda:
        ENV
    threads: WHOLE_MACHINE
    resources:
        gpu=1,
        mem_mb=lambda w: PLAN.runtime.cluster_resources(w.model)["mem_mb"],
        runtime=lambda w: PLAN.runtime.cluster_resources(w.model)["cell_minutes"],
    params:
        variant=cell_variant,
        quant=cell_quantization,
        decode_group=lambda w: PLAN.decode_group_arg(
            w.benchmark, w.config_id, cell_variant(w)
        ),
        key=lambda w: PLAN.worker_key(w.model, cell_quantization(w)),
        state_root=rel(PLAN.layout.worker_state_root),
        idle=PLAN.runtime.worker_idle_timeout,
        timeout=PLAN.runtime.cell_timeout,
        device_wait=PLAN.runtime.device_wait,
        # without the chat-template hash: the prepared-model marker (an input) holds it and
        # does not exist yet when a fresh run is planned (Plan.cell_fingerprint)
        fingerprint=lambda w: PLAN.cell_fingerprint(
            w.model,
            w.benchmark,
            w.config_id,
            int(w.seed),
            cell_variant(w),
            chat_template=False,
        ),
    shell:
        '"$PY" -m safetyrepro.cell_client --config {input.config_path:q}'
        " --config-id {wildcards.config_id:q} --model {wildcards.model:q} --variant {params.variant:q}"
        " --quantization {params.quant:q} --benchmark {wildcards.benchmark:q} --seed {wildcards.seed:q}"
        " --decode-group {params.decode_group:q} --rules {input.rules:q} --items {input.subset:q}"
        " --fewshot {input.fewshot:q} --model-marker {input.model:q}"
        " --fingerprint {params.fingerprint:q} --out {output:q}"
        " --state-root {params.state_root:q} --key {params.key:q} --idle-timeout {params.idle:q}"
        " --timeout {params.timeout:q} --device-wait {params.device_wait:q} > {log:q} 2>&1"
