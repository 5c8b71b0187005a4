# Figures and the Markdown report (the HTML report comes from `snakemake --report`).


rule figures:
    input:
        [f"{TABLES}/{t}.parquet" for t in ("table2", "table4", "anova", "shap", "robustness", "robustness_regression")],
    output:
        [report(f"{RESULTS}/figures/{f}.png", caption=f"../report/fig_{f}.rst", category="Figures") for f in FIGURES],
    log:
        f"{RESULTS}/logs/figures.log",
    shell:
        "{SR} analyze figures {TABLES} --out-dir {RESULTS}/figures > {log} 2>&1"


rule report_md:
    input:
        [f"{TABLES}/{t}.parquet" for t in PAPER_TABLES + ["anova", "shap", "robustness", "subsample_stability"]],
        [f"{RESULTS}/figures/{f}.png" for f in FIGURES],
        f"{RESULTS}/cards/index.json",
        [f"{TABLES}/precision.parquet"] if PLAN.precision_check else [],
    output:
        f"{RESULTS}/report.md",
    log:
        f"{RESULTS}/logs/report_md.log",
    shell:
        "{SR} analyze report-md {TABLES} --figures-dir {RESULTS}/figures --out {output} > {log} 2>&1"
