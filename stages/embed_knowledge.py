"""embed_knowledge@<dataset>: text features of every knowledge text set for the params' model ->
features/<model>/<dataset>/knowledge/ (a stage of its own: knowledge sets exist only for suite.knowledge)."""

from stages.command import parser, run
from stages.model_libraries import import_model_libraries
from vlbench.params import get, load_params
from vlbench.paths import features_dir, knowledge_dir


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    args = p.parse_args()
    params = load_params(args.params)
    import_model_libraries(params)
    from vlbench.embed import embed_text_sets
    from vlbench.engines import engine
    from vlbench.models.loading import load_model

    loaded = load_model(get(params, "model", dict), device=args.device)
    out = features_dir(loaded.fingerprint["model"], args.dataset) / "knowledge"
    counts = embed_text_sets(loaded, knowledge_dir(args.dataset), out, engine=engine())  # $VLBENCH_ENGINE's
    print(f"embed_knowledge {args.dataset}: {counts}")


if __name__ == "__main__":
    run(main)
