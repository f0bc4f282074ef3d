# trainplan: plan, prove and cost a distributed fine-tune. Table of contents only; logic is in src/trainplan.
import sys

from snakemake.utils import min_version, validate

from trainplan.config import require_proxy_executor
from trainplan.model.base import ConfigError
from trainplan.proxy.procs import forward_signals_to_proxies
from trainplan.report.headline import headline

min_version("9.0")


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/analytic.smk"
include: "rules/proxies.smk"
include: "rules/calibrate.smk"
include: "rules/cost.smk"
include: "rules/report.smk"


# Seconds-long rules run where Snakemake runs, never as cluster jobs (with --profile slurm only the proxies
# are submitted; their resources come from each RUN_SPEC: rules/proxies.smk).
localrules:
    all,
    analytic_model,
    select_proxies,
    aggregate,
    calibrate,
    fit_scaling,
    predict_production,
    cost_and_risk,
    figures,
    memo,
    launch_artifacts,


onstart:
    # the executor is known only here (None at parse time): a multi-node proxy cannot start under `--cores N`
    try:
        require_proxy_executor(
            STUDY.raw["proxies"],
            getattr(workflow.executor_plugin, "name", None),
            (job.rule.name for job in workflow.dag.needrun_jobs()),
        )
    except ConfigError as e:
        raise WorkflowError(f"Bad config: {e}") from None
    print(f"trainplan study hash: {STUDY_HASH}", file=sys.stderr)
    # SIGINT/SIGTERM also reach the local proxy launchers, which stop their ranks within seconds (Snakemake
    # alone would wait for the running jobs); no-op for Slurm jobs, which are not children of this process
    forward_signals_to_proxies()


onsuccess:
    # the answer where the run ends: memo path, recommendation, p10–p90, cost (nothing if the memo was not built)
    if (line := headline(R)) is not None:
        print(line, file=sys.stderr)


rule all:
    default_target: True
    input:
        all_outputs(),
