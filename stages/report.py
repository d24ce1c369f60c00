"""report: reports/metrics.json ({analysis: {dataset: {metric: value}}}), reports/model.json, reports/reference.json
(the verdicts against the papers' tables), the charts each analysis names, and reports/index.html (the page)."""

import json

from stages.command import parser, run
from vlbench.params import load_params
from vlbench.report.aggregate import INDEX_FILE, declared_metrics, report_datasets, write_report
from vlbench.results import REFERENCE_FILE


def main() -> None:
    args = parser(__doc__, dataset=False).parse_args()
    params = load_params(args.params)
    reproduce = {"model": (params.get("model") or {}).get("slug"), "suite": (params.get("suite") or {}).get("slug")}
    metrics = write_report(report_datasets(params), reproduce, declared_metrics(params))
    print(json.dumps(metrics, indent=2))
    reference = json.loads(REFERENCE_FILE.read_text())
    print(f"{REFERENCE_FILE}: " + (", ".join(f"{n} {v}" for v, n in reference["summary"].items())
                                   if reference["applies"] else reference["reason"]))
    print(f"the page: {INDEX_FILE}")


if __name__ == "__main__":
    run(main)
