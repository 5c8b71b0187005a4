# Analyses: the paper's tables, variance/SHAP attribution, robustness, item-subsample
# stability, the precision check and the GRID cards. Each rule calls `safetyrepro analyze`.


rule paper_tables:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
    output:
        **table_outputs("tables"),
    log:
        f"{RESULTS}/logs/paper_tables.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.tables"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        threshold=ANALYSIS["parse_clean_threshold"],
        samples=ANALYSIS["bootstrap_samples"],
        seed=ANALYSIS["bootstrap_seed"],
        rules=RUN.rules.path,
        noise_samples=(
            ""
            if ANALYSIS["resampling_samples"] is None
            else f"--noise-samples {int(ANALYSIS['resampling_samples'])}"
        ),
    shell:
        '"$PY" -m safetyrepro analyze tables {input.cells:q} --out-dir {params.out_dir:q} --threshold {params.threshold:q}'
        " --bootstrap-samples {params.samples:q} --bootstrap-seed {params.seed:q}"
        " --rules {params.rules:q} --item-results {input.item_results:q} {params.noise_samples} > {log:q} 2>&1"


rule significance:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
    output:
        **table_outputs("significance"),
    log:
        f"{RESULTS}/logs/significance.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.significance"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        alpha=ANALYSIS["alpha"],
        samples=(
            ""
            if ANALYSIS["resampling_samples"] is None
            else f"--samples {int(ANALYSIS['resampling_samples'])}"
        ),
        seed=ANALYSIS["bootstrap_seed"],
        family=ANALYSIS["significance_family"],
        correction=ANALYSIS["significance_correction"],
    shell:
        '"$PY" -m safetyrepro analyze significance {input.cells:q} {input.item_results:q}'
        " --out-dir {params.out_dir:q} --alpha {params.alpha:q} {params.samples}"
        " --seed {params.seed:q} --family {params.family:q} --correction {params.correction:q} > {log:q} 2>&1"


rule nearest_reversal:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        significance_configs=f"{TABLES}/significance_configs.parquet",
    output:
        **table_outputs("nearest-reversal"),
    log:
        f"{RESULTS}/logs/nearest_reversal.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.tables"),
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
        **table_outputs("variance"),
    log:
        f"{RESULTS}/logs/variance.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.variance"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
    shell:
        '"$PY" -m safetyrepro analyze variance {input:q} --out-dir {params.out_dir:q} > {log:q} 2>&1'


rule robustness:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
    output:
        **table_outputs("robustness"),
    log:
        f"{RESULTS}/logs/robustness.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.robustness"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        nominal=ANALYSIS["nominal_config"],
    shell:
        '"$PY" -m safetyrepro analyze robustness {input.cells:q} {input.item_results:q}'
        " --out-dir {params.out_dir:q} --nominal-config {params.nominal:q} > {log:q} 2>&1"


rule subsample_stability:
    input:
        item_results=f"{TABLES}/item_results.parquet",
        subsets=expand(f"{RESULTS}/items/{{b}}.parquet", b=RUN.benchmarks),
    output:
        **table_outputs("subsample"),
    log:
        f"{RESULTS}/logs/subsample_stability.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.subsample"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        items_dir=lambda w, input: os.path.dirname(input.subsets[0]),
        fraction=ANALYSIS["subsample_fraction"],
        repeats=ANALYSIS["subsample_repeats"],
        seed=ANALYSIS["bootstrap_seed"],
        rules=RUN.rules.path,
        noise_samples=(
            ""
            if ANALYSIS["resampling_samples"] is None
            else f"--noise-samples {int(ANALYSIS['resampling_samples'])}"
        ),
    shell:
        '"$PY" -m safetyrepro analyze subsample {input.item_results:q} --items-dir {params.items_dir:q}'
        " --out-dir {params.out_dir:q}"
        " --fraction {params.fraction:q} --repeats {params.repeats:q} --seed {params.seed:q}"
        " --rules {params.rules:q} {params.noise_samples} > {log:q} 2>&1"


rule bbq_bias:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        item_results=f"{TABLES}/item_results.parquet",
        bbq_items=f"{RESULTS}/items/bbq.parquet",
    output:
        **table_outputs("bbq-bias"),
    log:
        f"{RESULTS}/logs/bbq_bias.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.bbq_bias"),
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
        **table_outputs("precision"),
    log:
        f"{RESULTS}/logs/precision_check.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.precision"),
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
        cross_package=CROSS_PACKAGE_TABLES,
        precision=(
            [table_outputs("precision")[n] for n in ("precision", "precision_cells")]
            if PLAN.precision_check
            else []
        ),
        scale_probe=SCALE_PROBE_TABLES,
    output:
        # every card (one per model and benchmark) and the index, as the package names them
        cards=[p for k, p in card_outputs().items() if k != "index"],
        index=report(
            card_outputs()["index"],
            caption="../report/cards.rst",
            category="GRID cards",
        ),
    log:
        f"{RESULTS}/logs/cards.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.cards"),
        out_dir=lambda w, output: os.path.dirname(output.index),
        cross_package=lambda w, input: (
            f"--cross-package {shlex.quote(input.cross_package[0])}"
            if input.cross_package
            else ""
        ),
        precision=lambda w, input: (
            f"--precision {shlex.quote(input.precision[0])}" if input.precision else ""
        ),
        scale_probe=lambda w, input: (
            f"--scale-probe {shlex.quote(input.scale_probe[0])}"
            if input.scale_probe
            else ""
        ),
    shell:
        '"$PY" -m safetyrepro analyze cards {input.cells:q} --provenance {input.provenance:q}'
        " --significance {input.significance:q} --nearest-reversal {input.nearest_reversal:q}"
        " {params.cross_package} {params.precision} {params.scale_probe} --out-dir {params.out_dir:q} > {log:q} 2>&1"


rule scale_probe:
    input:
        cells=f"{TABLES}/cell_scores.parquet",
        significance_configs=f"{TABLES}/significance_configs.parquet",
    output:
        **table_outputs("scale-probe"),
    log:
        f"{RESULTS}/logs/scale_probe.log",
    conda:
        ENV
    params:
        code=PLAN.fingerprints.code_fingerprint("safetyrepro.analysis.scale_probe"),
        out_dir=lambda w, output: os.path.dirname(output[0]),
        families=" ".join(
            f"--family {shlex.quote(','.join(f))}" for f in PLAN.scale_probe_families
        ),
        rules=RUN.rules.path,
    shell:
        '"$PY" -m safetyrepro analyze scale-probe {input.cells:q} --out-dir {params.out_dir:q}'
        " {params.families} --significance-configs {input.significance_configs:q}"
        " --rules {params.rules:q} > {log:q} 2>&1"
