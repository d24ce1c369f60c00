"""code: data/code/, the fingerprint of the files each stage's command runs (vlbench.pipeline.stage_modules)."""

from stages.common import parser, run
from vlbench.config import load_params
from vlbench.io import atomic_dir
from vlbench.pipeline import CODE_DIR, fingerprint, stage_modules


def main() -> None:
    args = parser(__doc__, dataset=False).parse_args()
    files = stage_modules(load_params(args.params))
    with atomic_dir(CODE_DIR) as tmp:
        for name, modules in files.items():
            path = tmp / f"{name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(fingerprint(modules))
    print(f"code: {len(files)} fingerprints in {CODE_DIR}")


if __name__ == "__main__":
    run(main)
