# One job per cell: (model, benchmark, config, seed) of a variant (main, or bf16 = the
# precision check on conservative_core; its shards live under shards_bf16/), but for the cells
# of decode groups, one job per group (`cell_group_<variant>`, below). One rule, `cell`, for
# all others, so `--set-resources cell:...` reaches each such job; its priority is a function
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


# One job per decode group (Plan.group_jobs): where every free-form decode group of a variant
# has the same decodings and seeds (the default and paper envelopes: greedy, 5 x T=0.3, 5 x
# T=0.7), the group's cells are one job writing all their shards. The worker computes a whole
# group for its first cell anyway; one job spares the others' hand-off (a Snakemake job and a
# client process each, about 50 ms). Its wildcards are the group's (model, benchmark, template,
# shots) and it takes precedence over `cell` for those shards (ruleorder below); every other
# cell (logprob, the precision check's, a hand-made envelope's) stays one `cell` job. A failed
# group job loses its shards (Snakemake removes a failed job's outputs) and reruns whole.
# Local runs only: on a cluster every cell stays a `cell` job, so --group-components and
# `--set-resources cell:...` keep counting cells there (docs/SLURM.md) and a Slurm job's
# minutes stay the sum of its cells'. A cluster run (and its dry run) names its parallel jobs
# with --jobs (Snakemake requires it for a cluster executor) and a local run its cores with
# --cores (make run, README); a local run given --jobs also stays one job per cell.
GROUP_JOBS = not workflow.remote_exec and workflow.nodes is None


for _variant in SHARD_ROOTS if GROUP_JOBS else ():
    _groups = PLAN.group_jobs(_variant)
    if _groups is None:
        continue

    rule:
        name:
            f"cell_group_{_variant}"
        input:
            config_path=ancient(CONFIG),
            rules=ancient(RULES),
            subset=lambda w: rel(PLAN.layout.items_path(w.benchmark)),
            fewshot=lambda w: rel(PLAN.layout.fewshot_path(w.benchmark)),
            model=lambda w: rel(PLAN.layout.model_marker(w.model)),
        output:
            [rel(p) for p in _groups.output_patterns(PLAN.layout)],
        log:
            f"{RESULTS}/logs/cells/{{shards}}/{{model}}/{{benchmark}}/{{template}}-{{shots}}-group.log",
        wildcard_constraints:
            shards=re.escape(SHARD_ROOTS[_variant]),
            model="|".join(re.escape(m) for m in _groups.models),
            benchmark="|".join(re.escape(b) for b in _groups.benchmarks),
            template="|".join(re.escape(t) for t in _groups.templates),
            shots="|".join(re.escape(k) for k in _groups.shots),
        priority: lambda w, v=_variant: PLAN.cell_priority(w.model, v)
        conda:
            ENV
        threads: WHOLE_MACHINE
        resources:
            gpu=1,
        params:
            variant=_variant,
            quant=lambda w, v=_variant: PLAN.quantization(w.model, v),
            decode_group=format_decode_group(_groups.decode_group),
            # each cell's config id, seed, fingerprint (without the chat-template hash, as the
            # cell rule's) and output: a changed fingerprint reruns the group
            cells=lambda w, v=_variant: group_cell_args(w, v),
            key=lambda w, v=_variant: PLAN.worker_key(
                w.model, PLAN.quantization(w.model, v)
            ),
            state_root=rel(PLAN.layout.worker_state_root),
            idle=PLAN.runtime.worker_idle_timeout,
            timeout=PLAN.runtime.cell_timeout,
            device_wait=PLAN.runtime.device_wait,
        shell:
            '"$PY" -m safetyrepro.cell_client --config {input.config_path:q}'
            " --model {wildcards.model:q} --variant {params.variant:q}"
            " --quantization {params.quant:q} --benchmark {wildcards.benchmark:q}"
            " --decode-group {params.decode_group:q} --rules {input.rules:q} --items {input.subset:q}"
            " --fewshot {input.fewshot:q} --model-marker {input.model:q} {params.cells}"
            " --state-root {params.state_root:q} --key {params.key:q} --idle-timeout {params.idle:q}"
            " --timeout {params.timeout:q} --device-wait {params.device_wait:q} > {log:q} 2>&1"

    workflow.ruleorder(f"cell_group_{_variant}", "cell")
