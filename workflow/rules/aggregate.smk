# Scoring and aggregation: re-parse every shard's raw outputs with the current parsers,
# average sampled cells over seeds, and write the publishable cell-score grid and rho_flip.
# The aggregation job reads exactly what its rule declares: the shards, the item files and the
# run config with its rules. Their list (with each shard's expected fingerprint) is written by
# `aggregate_inputs`, a local job of the Snakemake process, from the same plan: a list of
# ~1,800 paths is too long for one shell command.


localrules:
    aggregate_inputs,


rule aggregate_inputs:
    input:
        shards=lambda w: [rel(p) for p in PLAN.shards(w.variant)],
        item_files=[rel(PLAN.layout.items_path(b)) for b in RUN.benchmarks],
        # the expected fingerprints name each model's chat template, from its marker
        models=[rel(PLAN.layout.model_marker(m)) for m in RUN.models],
    output:
        f"{RESULTS}/aggregate/inputs_{{variant}}.json",
    log:
        f"{RESULTS}/logs/aggregate_inputs_{{variant}}.log",
    wildcard_constraints:
        variant="|".join(SHARD_ROOTS),
    params:
        # the code writing the list (safetyrepro.aggregate_inputs.write_inputs)
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.aggregate_inputs"),
    run:
        write_aggregate_inputs(output[0], wildcards.variant, input, log[0])


rule aggregate:
    input:
        config_path=ancient(CONFIG),
        rules=ancient(RULES),
        inputs=f"{RESULTS}/aggregate/inputs_main.json",
        shards=[rel(p) for p in PLAN.shards("main")],
        item_files=[rel(PLAN.layout.items_path(b)) for b in RUN.benchmarks],
    output:
        **aggregate_outputs("main"),
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        ENV
    params:
        out_dir=lambda w, output: os.path.dirname(output.cell_scores),
        scoring=PLAN.fingerprints.scoring_code,
    shell:
        '"$PY" -m safetyrepro aggregate --config {input.config_path:q} --variant main'
        " --inputs {input.inputs:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule aggregate_bf16:
    input:
        config_path=ancient(CONFIG),
        rules=ancient(RULES),
        inputs=f"{RESULTS}/aggregate/inputs_bf16.json",
        shards=[rel(p) for p in PLAN.shards("bf16")],
        item_files=[rel(PLAN.layout.items_path(b)) for b in RUN.benchmarks],
    output:
        **aggregate_outputs("bf16"),
    log:
        f"{RESULTS}/logs/aggregate_bf16.log",
    conda:
        ENV
    params:
        out_dir=lambda w, output: os.path.dirname(output.cell_scores),
        scoring=PLAN.fingerprints.scoring_code,
    shell:
        '"$PY" -m safetyrepro aggregate --config {input.config_path:q} --variant bf16'
        " --inputs {input.inputs:q} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule rho_flip:
    input:
        f"{RESULTS}/tables/cell_scores.parquet",
    output:
        **{k: str(p) for k, p in analysis_outputs.rho_flip_outputs(TABLES).items()},
    log:
        f"{RESULTS}/logs/rho_flip.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.metrics.tables"),
    shell:
        '"$PY" -m safetyrepro rho-flip {input:q} --out {output.pairs:q} > {log:q} 2>&1'
