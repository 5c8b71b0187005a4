# Benchmark item subsets and few-shot pools (read from the configured data directory).


rule items:
    output:
        # update(): not deleted before the job, and restored if it fails (a failed rebuild
        # keeps the good files); the job leaves files holding the same items untouched.
        subset=update(f"{RESULTS}/items/{{benchmark}}.parquet"),
        fewshot=update(f"{RESULTS}/items/{{benchmark}}.fewshot.parquet"),
    log:
        f"{RESULTS}/logs/items/{{benchmark}}.log",
    priority: 100  # before any cell, so each model's cells then run back to back
    conda:
        ENV
    params:
        out_dir=lambda w, output: os.path.dirname(output.subset),
        config=CONFIG,
        fingerprint=lambda w: PLAN.fingerprints.items_fingerprint(w.benchmark),
    shell:
        '"$PY" -m safetyrepro items --config {params.config:q} --benchmark {wildcards.benchmark:q}'
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"
