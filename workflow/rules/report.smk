# Figures and the Markdown report (the HTML report comes from `snakemake --report`).


rule figures:
    input:
        tables=[
            f"{TABLES}/{t}.parquet"
            for t in (
                "table2",
                "significance",
                "table4",
                "anova",
                "shap",
                "robustness",
                "robustness_regression",
            )
        ],
    output:
        [
            report(
                f"{RESULTS}/figures/{f}.png",
                caption=f"../report/fig_{f}.rst",
                category="Figures",
            )
            for f in FIGURES
        ],
    log:
        f"{RESULTS}/logs/figures.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.figures"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        tables_dir=lambda w, input: os.path.dirname(input.tables[0]),
    shell:
        '"$PY" -m safetyrepro analyze figures {params.tables_dir:q}'
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule report_md:
    input:
        f"{RESULTS}/cards/index.json",
        [f"{TABLES}/precision.parquet"] if PLAN.precision_check else [],
        BBQ_BIAS_TABLES,
        [f"{TABLES}/cross_package.parquet"] if CROSS_PACKAGE else [],
        tables=[
            f"{TABLES}/{t}.parquet"
            for t in PAPER_TABLES
            + SIGNIFICANCE_TABLES
            + [
                "anova",
                "shap",
                "robustness",
                "subsample_stability",
                "subsample_rho_flip",
                "nearest_reversal",
            ]
        ],
        figures=[f"{RESULTS}/figures/{f}.png" for f in FIGURES],
    output:
        f"{RESULTS}/report.md",
    log:
        f"{RESULTS}/logs/report_md.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.report_md"),
        tables_dir=lambda w, input: os.path.dirname(input.tables[0]),
        figures_dir=lambda w, input: os.path.dirname(input.figures[0]),
    shell:
        '"$PY" -m safetyrepro analyze report-md {params.tables_dir:q}'
        " --figures-dir {params.figures_dir:q} --out {output:q} > {log:q} 2>&1"
