"""code: data/code/, the fingerprint of the files each stage's command runs (vlbench.pipeline.stage_modules).

Every stage depends on a fingerprint, so this is the first stage of a run that changed the code or the suite: it
checks the text sets the suite's analyses need (`check_text_sets`) before anything is prepared or embedded."""

from stages.command import parser, run
from vlbench.analyses.text_sets import check_text_sets
from vlbench.io import atomic_dir
from vlbench.params import load_params
from vlbench.pipeline import CODE_DIR, fingerprint, stage_modules


def main() -> None:
    args = parser(__doc__, dataset=False).parse_args()
    params = load_params(args.params)
    check_text_sets(params, known_only=True)
    files = stage_modules(params)
    with atomic_dir(CODE_DIR) as tmp:
        for name, modules in files.items():
            path = tmp / f"{name}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(fingerprint(modules))
    print(f"code: {len(files)} fingerprints in {CODE_DIR}")


if __name__ == "__main__":
    run(main)
