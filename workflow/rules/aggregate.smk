# Scoring and aggregation: re-parse every shard's raw outputs with the current parsers,
# average sampled cells over seeds, and write the publishable cell-score grid and rho_flip.


rule aggregate:
    input:
        shards=[rel(p) for p in PLAN.shards("main")],
    output:
        **aggregate_outputs("main"),
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        ENV
    params:
        out_dir=lambda w, output: os.path.dirname(output.cell_scores),
        config=CONFIG,
        scoring=PLAN.scoring_code,
    shell:
        '"$PY" -m safetyrepro aggregate --config {params.config:q} --variant main'
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule aggregate_bf16:
    input:
        shards=[rel(p) for p in PLAN.shards("bf16")],
    output:
        **aggregate_outputs("bf16"),
    log:
        f"{RESULTS}/logs/aggregate_bf16.log",
    conda:
        ENV
    params:
        out_dir=lambda w, output: os.path.dirname(output.cell_scores),
        config=CONFIG,
        scoring=PLAN.scoring_code,
    shell:
        '"$PY" -m safetyrepro aggregate --config {params.config:q} --variant bf16'
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


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
        code=PLAN.code_fingerprint("safetyrepro.metrics.tables"),
    shell:
        '"$PY" -m safetyrepro rho-flip {input:q} --out {output.pairs:q} > {log:q} 2>&1'
