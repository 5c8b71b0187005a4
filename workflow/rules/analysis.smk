# Analyses: the paper's tables, variance/SHAP attribution, robustness, item-subsample
# stability, the precision check and the GRID cards. Each rule calls `safetyrepro analyze`.


rule paper_tables:
    input:
        f"{TABLES}/cell_scores.parquet",
    output:
        [f"{TABLES}/{t}.parquet" for t in PAPER_TABLES],
        [
            report(
                f"{TABLES}/{t}.csv",
                caption=f"../report/{t}.rst",
                category="Tables",
            )
            for t in PAPER_TABLES
        ],
    log:
        f"{RESULTS}/logs/paper_tables.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.tables"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        threshold=ANALYSIS["parse_clean_threshold"],
        samples=ANALYSIS["bootstrap_samples"],
        seed=ANALYSIS["bootstrap_seed"],
        rules=RUN.rules.path,
    shell:
        '"$PY" -m safetyrepro analyze tables {input:q} --out-dir {params.out_dir:q} --threshold {params.threshold:q}'
        " --bootstrap-samples {params.samples:q} --bootstrap-seed {params.seed:q}"
        " --rules {params.rules:q} > {log:q} 2>&1"


rule significance:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
    output:
        [f"{TABLES}/{t}.parquet" for t in SIGNIFICANCE_TABLES],
        [
            report(
                f"{TABLES}/{t}.csv",
                caption=f"../report/{t}.rst",
                category="Significance",
            )
            for t in SIGNIFICANCE_TABLES
        ],
    log:
        f"{RESULTS}/logs/significance.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.significance"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        alpha=ANALYSIS["alpha"],
        samples=ANALYSIS["bootstrap_samples"],
        seed=ANALYSIS["bootstrap_seed"],
    shell:
        '"$PY" -m safetyrepro analyze significance {input.cells:q} {input.item_results:q}'
        " --out-dir {params.out_dir:q} --alpha {params.alpha:q}"
        " --bootstrap-samples {params.samples:q} --bootstrap-seed {params.seed:q} > {log:q} 2>&1"


rule nearest_reversal:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        significance_configs=f"{TABLES}/significance_configs.parquet",
    output:
        f"{TABLES}/nearest_reversal.parquet",
        report(
            f"{TABLES}/nearest_reversal.csv",
            caption="../report/nearest_reversal.rst",
            category="Significance",
        ),
    log:
        f"{RESULTS}/logs/nearest_reversal.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.tables"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        nominal=ANALYSIS["nominal_config"],
    shell:
        '"$PY" -m safetyrepro analyze nearest-reversal {input.cells:q} --out-dir {params.out_dir:q}'
        " --nominal-config {params.nominal:q}"
        " --significance-configs {input.significance_configs:q} > {log:q} 2>&1"


rule variance:
    input:
        f"{TABLES}/cell_scores.parquet",
    output:
        anova=f"{TABLES}/anova.parquet",
        anova_csv=report(
            f"{TABLES}/anova.csv",
            caption="../report/anova.rst",
            category="Variance",
        ),
        shap=f"{TABLES}/shap.parquet",
        shap_csv=report(
            f"{TABLES}/shap.csv", caption="../report/shap.rst", category="Variance"
        ),
    log:
        f"{RESULTS}/logs/variance.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.variance"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
    shell:
        '"$PY" -m safetyrepro analyze variance {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1'


rule robustness:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
        subsets=expand(f"{RESULTS}/items/{{b}}.parquet", b=RUN.benchmarks),
    output:
        f"{TABLES}/robustness.parquet",
        report(
            f"{TABLES}/robustness.csv",
            caption="../report/robustness.rst",
            category="Robustness",
        ),
        f"{TABLES}/robustness_regression.parquet",
    log:
        f"{RESULTS}/logs/robustness.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.robustness"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        items_dir=lambda w, input: os.path.dirname(input.subsets[0]),
        nominal=ANALYSIS["nominal_config"],
    shell:
        '"$PY" -m safetyrepro analyze robustness {input.cells:q} {input.item_results:q} --items-dir {params.items_dir:q}'
        " --out-dir {params.out_dir:q} --nominal-config {params.nominal:q} > {log:q} 2>&1"


rule subsample_stability:
    input:
        item_results=f"{TABLES}/item_results.parquet",
        subsets=expand(f"{RESULTS}/items/{{b}}.parquet", b=RUN.benchmarks),
    output:
        f"{TABLES}/subsample_stability.parquet",
        report(
            f"{TABLES}/subsample_stability.csv",
            caption="../report/subsample_stability.rst",
            category="Robustness",
        ),
        f"{TABLES}/subsample_cells.parquet",
        f"{TABLES}/subsample_rho_flip.parquet",
        report(
            f"{TABLES}/subsample_rho_flip.csv",
            caption="../report/subsample_rho_flip.rst",
            category="Robustness",
        ),
    log:
        f"{RESULTS}/logs/subsample_stability.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.subsample"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        items_dir=lambda w, input: os.path.dirname(input.subsets[0]),
        fraction=ANALYSIS["subsample_fraction"],
        repeats=ANALYSIS["subsample_repeats"],
        seed=ANALYSIS["bootstrap_seed"],
        rules=RUN.rules.path,
    shell:
        '"$PY" -m safetyrepro analyze subsample {input.item_results:q} --items-dir {params.items_dir:q}'
        " --out-dir {params.out_dir:q}"
        " --fraction {params.fraction:q} --repeats {params.repeats:q} --seed {params.seed:q}"
        " --rules {params.rules:q} > {log:q} 2>&1"


rule bbq_bias:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
        bbq_items=f"{RESULTS}/items/bbq.parquet",
    output:
        f"{TABLES}/bbq_bias.parquet",
        report(
            f"{TABLES}/bbq_bias.csv",
            caption="../report/bbq_bias.rst",
            category="Robustness",
        ),
        f"{TABLES}/bbq_bias_summary.parquet",
    log:
        f"{RESULTS}/logs/bbq_bias.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.bbq_bias"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        items_dir=lambda w, input: os.path.dirname(input.bbq_items),
    shell:
        '"$PY" -m safetyrepro analyze bbq-bias {input.cells:q} {input.item_results:q} --items-dir {params.items_dir:q}'
        " --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule precision_check:
    input:
        main=f"{TABLES}/cell_scores.parquet",
        bf16=f"{TABLES}/cell_scores_bf16.parquet",
    output:
        f"{TABLES}/precision.parquet",
        report(
            f"{TABLES}/precision.csv",
            caption="../report/precision.rst",
            category="Robustness",
        ),
        f"{TABLES}/precision_cells.parquet",
    log:
        f"{RESULTS}/logs/precision_check.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.precision"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        rules=RUN.rules.path,
    shell:
        '"$PY" -m safetyrepro analyze precision {input.main:q} {input.bf16:q}'
        " --out-dir {params.out_dir:q} --rules {params.rules:q} > {log:q} 2>&1"


rule cards:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        provenance=f"{TABLES}/provenance.json",
        significance=f"{TABLES}/significance.parquet",
        nearest_reversal=f"{TABLES}/nearest_reversal.parquet",
        cross_package=[f"{TABLES}/cross_package.parquet"] if CROSS_PACKAGE else [],
    output:
        report(
            f"{RESULTS}/cards/index.json",
            caption="../report/cards.rst",
            category="GRID cards",
        ),
    log:
        f"{RESULTS}/logs/cards.log",
    conda:
        ENV
    params:
        code=PLAN.code_fingerprint("safetyrepro.analysis.cards"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        cross_package=lambda w, input: (
            f"--cross-package {shlex.quote(input.cross_package[0])}"
            if input.cross_package
            else ""
        ),
    shell:
        '"$PY" -m safetyrepro analyze cards {input.cells:q} --provenance {input.provenance:q}'
        " --significance {input.significance:q} --nearest-reversal {input.nearest_reversal:q}"
        " {params.cross_package} --out-dir {params.out_dir:q} > {log:q} 2>&1"
