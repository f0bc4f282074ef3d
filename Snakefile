# trainplan: plan, prove and cost a distributed fine-tune. Table of contents only; logic is in src/trainplan.
from snakemake.utils import min_version, validate

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/analytic.smk"
include: "rules/proxies.smk"
include: "rules/calibrate.smk"
include: "rules/cost.smk"
include: "rules/report.smk"


rule all:
    default_target: True
    input:
        all_outputs(),
