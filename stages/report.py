"""report: reports/metrics.json ({analysis: {dataset: {metric: value}}}), reports/model.json, reports/reference.json
(the verdicts against the papers' tables), one chart per analysis."""

import json

from stages.common import parser, run
from vlbench.analyses import ANALYSES
from vlbench.config import get, load_params
from vlbench.report.aggregate import write_report
from vlbench.results import REFERENCE_FILE


def main() -> None:
    args = parser(__doc__, dataset=False).parse_args()
    params = load_params(args.params)
    datasets = {a: list(get(params, f"suite.{a}", list)) for a in ANALYSES}
    # dataset-level vocabularies (stage extensibility_sets@<name>) report under extensibility, each by its name
    sets = (params.get("suite") or {}).get("extensibility_sets") or {}
    datasets["extensibility"] = datasets.get("extensibility", []) + list(sets)
    metrics = write_report({a: d for a, d in datasets.items() if d})
    print(json.dumps(metrics, indent=2))
    reference = json.loads(REFERENCE_FILE.read_text())
    print(f"{REFERENCE_FILE}: " + (", ".join(f"{n} {v}" for v, n in reference["summary"].items())
                                   if reference["applies"] else reference["reason"]))


if __name__ == "__main__":
    run(main)
