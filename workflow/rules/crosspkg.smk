# The cross-package case study: the nominal configuration scored by lm-evaluation-harness and
# Inspect on the run's items and model folders, beside the run's own nominal cells
# (docs/CROSS_PACKAGE.md). Enabled by analysis.cross_package. The SafetyRepro rows take the
# bf16 precision check's cells where the run has them (the issue's nominal precision), else the
# run's own; each row names its precision.


rule cross_package:
    input:
        subsets=[f"{RESULTS}/items/{b}.parquet" for b in CROSS_PACKAGE_BENCHMARKS],
        item_results=f"{TABLES}/item_results.parquet",
        item_results_bf16=(
            [aggregate_outputs("bf16")["item_results"]] if PLAN.precision_check else []
        ),
        models=[f"{RESULTS}/models/{m}.json" for m in RUN.models],
    output:
        **CROSS_PACKAGE_OUTPUTS,
    log:
        f"{RESULTS}/logs/cross_package.log",
    conda:
        ENV
    threads: WHOLE_MACHINE
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.crosspkg.stage"),
        config=CONFIG,
        items_dir=lambda w, input: os.path.dirname(input.subsets[0]),
        work=f"{RESULTS}/cross_package",
        loop=ANALYSIS["cross_package_lmeval_loop"],
        bf16=lambda w, input: (
            f"--item-results-bf16 {shlex.quote(input.item_results_bf16[0])}"
            if input.item_results_bf16
            else ""
        ),
    shell:
        '"$PY" -m safetyrepro cross-package --config {params.config:q} --items-dir {params.items_dir:q}'
        " --item-results {input.item_results:q} {params.bf16} --out {output.table:q} --work {params.work:q}"
        " --figure {output.figure:q} --lmeval-loop {params.loop:q} > {log:q} 2>&1"
