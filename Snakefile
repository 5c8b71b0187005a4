# SafetyRepro workflow: models -> item subsets -> one job per (model, benchmark, config, seed)
# cell -> scoring/aggregation -> analyses -> report. All logic lives in src/safetyrepro; the
# rules below only name inputs, outputs, fingerprints and the CLI call.
#
#   snakemake --cores 1 --resources gpu=1 --configfile config/config.yaml --profile profiles/default
#   snakemake --profile profiles/slurm --configfile config/paper.yaml
# The config file is --configfile (default: config/config.yaml, see common.smk); it is
# validated against src/safetyrepro/data/schema/config.schema.json before any job starts.


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/cells.smk"
include: "workflow/rules/aggregate.smk"
include: "workflow/rules/analysis.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/crosspkg.smk"


rule all:
    default_target: True
    input:
        all_targets(),
