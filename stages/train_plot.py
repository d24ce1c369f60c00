"""train_plot@<toy model>: the toy model's training loss as a static SVG beside its log (data/models/<toy>/train_log.svg).

A stage of its own, so that a change to the chart code re-renders the chart and never re-trains the model.
DVC declares the SVG as an image plot: `dvc plots show` then needs no network (a template plot of the CSV would
load Vega from a CDN).
"""

from stages.command import parser, run
from vlbench.paths import model_dir
from vlbench.report.plots import TRAIN_LOG_PLOT, write_train_log_plot


def main() -> None:
    p = parser(__doc__, dataset=False)
    p.add_argument("--model", required=True, help="toy model slug, an item of model.pretrain")
    args = p.parse_args()
    out = model_dir(args.model)
    print(write_train_log_plot(args.model, out / "train_log.csv", out / TRAIN_LOG_PLOT))


if __name__ == "__main__":
    run(main)
