"""report: reports/metrics.json ({analysis: {dataset: {metric: value}}, model: fingerprint}) and plot data."""

import json

from stages.common import parser, run
from vlbench.config import REPORTS, get, load_params
from vlbench.report.aggregate import ANALYSES, write_report


def main() -> None:
    args = parser(__doc__, dataset=False).parse_args()
    params = load_params(args.params)
    datasets = {a: list(get(params, f"suite.{a}", list)) for a in ANALYSES if get(params, "suite", dict).get(a)}
    metrics = write_report(REPORTS, datasets)
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    run(main)
