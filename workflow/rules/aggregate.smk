# Scoring and aggregation: re-parse every shard's raw outputs with the current parsers,
# average sampled cells over seeds, and write the publishable cell-score grid and rho_flip.


rule aggregate:
    input:
        shards=PLAN.shards("main"),
    output:
        cell_scores=f"{RESULTS}/tables/cell_scores.parquet",
        cell_scores_csv=f"{RESULTS}/tables/cell_scores.csv",
        item_results=f"{RESULTS}/tables/item_results.parquet",
        provenance=f"{RESULTS}/tables/provenance.json",
    params:
        scoring=PLAN.scoring_code,
    log:
        f"{RESULTS}/logs/aggregate.log",
    shell:
        "{SR} aggregate --config {CONFIG_PATH} --variant main --out-dir {RESULTS}/tables 2> {log}"


rule aggregate_bf16:
    input:
        shards=PLAN.shards("bf16"),
    output:
        cell_scores=f"{RESULTS}/tables/cell_scores_bf16.parquet",
    params:
        scoring=PLAN.scoring_code,
    log:
        f"{RESULTS}/logs/aggregate_bf16.log",
    shell:
        "{SR} aggregate --config {CONFIG_PATH} --variant bf16 --out-dir {RESULTS}/tables 2> {log}"


rule rho_flip:
    input:
        f"{RESULTS}/tables/cell_scores.parquet",
    output:
        pairs=f"{RESULTS}/tables/rho_flip.parquet",
        csv=f"{RESULTS}/tables/rho_flip.csv",
    log:
        f"{RESULTS}/logs/rho_flip.log",
    shell:
        "{SR} rho-flip {input} --out {output.pairs} 2> {log}"
