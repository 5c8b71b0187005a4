# Analyses: the paper's tables, variance/SHAP attribution, robustness, item-subsample
# stability, the precision check and the GRID cards. Each rule calls `safetyrepro analyze`.

TABLES = f"{RESULTS}/tables"
PAPER_TABLES = ["table2", "table3", "table4", "parse_clean", "tau_r", "bootstrap"]
FIGURES = ["rho_heatmap", "orderings", "anova_shares", "shap_summary", "consistency"]


def analysis_targets():
    targets = [f"{TABLES}/{t}.parquet" for t in PAPER_TABLES]
    targets += [f"{TABLES}/{t}.parquet" for t in ("anova", "shap", "robustness", "subsample_stability")]
    targets += [f"{RESULTS}/cards/index.json", f"{RESULTS}/report.md"]
    targets += [f"{RESULTS}/figures/{f}.png" for f in FIGURES]
    if PLAN.precision_check:
        targets.append(f"{TABLES}/precision.parquet")
    return targets


ANALYSIS = RUN.section("analysis")


rule paper_tables:
    input:
        f"{TABLES}/cell_scores.parquet",
    output:
        [report(f"{TABLES}/{t}.parquet", caption=f"../report/{t}.rst", category="Tables") for t in PAPER_TABLES],
    params:
        threshold=ANALYSIS["parse_clean_threshold"],
        samples=ANALYSIS["bootstrap_samples"],
        seed=ANALYSIS["bootstrap_seed"],
    log:
        f"{RESULTS}/logs/paper_tables.log",
    shell:
        "{SR} analyze tables {input} --out-dir {TABLES} --threshold {params.threshold}"
        " --bootstrap-samples {params.samples} --bootstrap-seed {params.seed} > {log} 2>&1"


rule variance:
    input:
        f"{TABLES}/cell_scores.parquet",
    output:
        anova=report(f"{TABLES}/anova.parquet", caption="../report/anova.rst", category="Variance"),
        shap=report(f"{TABLES}/shap.parquet", caption="../report/shap.rst", category="Variance"),
    log:
        f"{RESULTS}/logs/variance.log",
    shell:
        "{SR} analyze variance {input} --out-dir {TABLES} > {log} 2>&1"


rule robustness:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
        subsets=expand(f"{RESULTS}/items/{{b}}.parquet", b=RUN.benchmarks),
    output:
        report(f"{TABLES}/robustness.parquet", caption="../report/robustness.rst", category="Robustness"),
        f"{TABLES}/robustness_regression.parquet",
    params:
        nominal=ANALYSIS["nominal_config"],
    log:
        f"{RESULTS}/logs/robustness.log",
    shell:
        "{SR} analyze robustness {input.cells} {input.item_results} --items-dir {RESULTS}/items"
        " --out-dir {TABLES} --nominal-config {params.nominal} > {log} 2>&1"


rule subsample_stability:
    input:
        item_results=f"{TABLES}/item_results.parquet",
        subsets=expand(f"{RESULTS}/items/{{b}}.parquet", b=RUN.benchmarks),
    output:
        report(f"{TABLES}/subsample_stability.parquet", caption="../report/subsample_stability.rst",
               category="Robustness"),
        f"{TABLES}/subsample_cells.parquet",
    params:
        fraction=ANALYSIS["subsample_fraction"],
        repeats=ANALYSIS["subsample_repeats"],
        seed=ANALYSIS["bootstrap_seed"],
        rules=RUN.rules.path,
    log:
        f"{RESULTS}/logs/subsample_stability.log",
    shell:
        "{SR} analyze subsample {input.item_results} --items-dir {RESULTS}/items --out-dir {TABLES}"
        " --fraction {params.fraction} --repeats {params.repeats} --seed {params.seed}"
        " --rules {params.rules} > {log} 2>&1"


rule precision_check:
    input:
        main=f"{TABLES}/cell_scores.parquet",
        bf16=f"{TABLES}/cell_scores_bf16.parquet",
    output:
        report(f"{TABLES}/precision.parquet", caption="../report/precision.rst", category="Robustness"),
        f"{TABLES}/precision_cells.parquet",
    params:
        rules=RUN.rules.path,
    log:
        f"{RESULTS}/logs/precision_check.log",
    shell:
        "{SR} analyze precision {input.main} {input.bf16} --out-dir {TABLES} --rules {params.rules} > {log} 2>&1"


rule cards:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        provenance=f"{TABLES}/provenance.json",
    output:
        report(f"{RESULTS}/cards/index.json", caption="../report/cards.rst", category="GRID cards"),
    log:
        f"{RESULTS}/logs/cards.log",
    shell:
        "{SR} analyze cards {input.cells} --provenance {input.provenance} --out-dir {RESULTS}/cards > {log} 2>&1"
