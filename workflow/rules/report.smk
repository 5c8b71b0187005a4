# Figures and the Markdown report (the HTML report comes from `snakemake --report`).


rule figures:
    input:
        # the tables the figures are drawn from (safetyrepro.analysis.outputs.FIGURES)
        tables=[f"{TABLES}/{t}.parquet" for t in analysis_outputs.figure_sources()],
    output:
        **{
            f: report(path, caption=f"../report/fig_{f}.rst", category="Figures")
            for f, path in figure_outputs().items()
        },
    log:
        f"{RESULTS}/logs/figures.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.figures"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        tables_dir=lambda w, input: os.path.dirname(input.tables[0]),
    shell:
        '"$PY" -m safetyrepro analyze figures {params.tables_dir:q}'
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule report_md:
    input:
        tables=report_tables(),
        figures=list(figure_outputs().values()),
    output:
        f"{RESULTS}/report.md",
    log:
        f"{RESULTS}/logs/report_md.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.report_md"),
        tables_dir=lambda w, input: os.path.dirname(input.tables[0]),
        figures_dir=lambda w, input: os.path.dirname(input.figures[0]),
    shell:
        '"$PY" -m safetyrepro analyze report-md {params.tables_dir:q}'
        " --figures-dir {params.figures_dir:q} --out {output:q} > {log:q} 2>&1"
