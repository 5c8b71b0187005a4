# Benchmark item subsets and few-shot pools (read from the configured data directory).


rule items:
    output:
        subset=f"{RESULTS}/items/{{benchmark}}.parquet",
        fewshot=f"{RESULTS}/items/{{benchmark}}.fewshot.parquet",
    params:
        fingerprint=lambda w: PLAN.items_fingerprint(w.benchmark),
    priority: 100  # before any cell, so each model's cells then run back to back
    log:
        f"{RESULTS}/logs/items/{{benchmark}}.log",
    shell:
        "{SR} items --config {CONFIG_PATH} --benchmark {wildcards.benchmark} 2> {log}"
