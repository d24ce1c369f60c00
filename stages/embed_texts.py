"""embed_texts@<dataset>: text features of every text set for the params' model -> features/<model>/<dataset>/text/."""

from stages.command import add_engine, parser, run
from stages.model_libraries import import_model_libraries
from vlbench.params import get, load_params
from vlbench.paths import features_dir, texts_dir


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")
    add_engine(p)
    args = p.parse_args()
    params = load_params(args.params)
    import_model_libraries(params)
    from vlbench.embed import embed_text_sets
    from vlbench.engines import engine

    chosen = engine(args.engine)
    loaded = chosen.load_model(get(params, "model", dict), device=args.device)
    counts = embed_text_sets(loaded, texts_dir(args.dataset), features_dir(loaded.fingerprint["model"], args.dataset) / "text",
                             engine=chosen)
    print(f"embed_texts {args.dataset}: {counts}")


if __name__ == "__main__":
    run(main)
