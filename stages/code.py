"""code: data/code/<layer>.txt, the fingerprint of the files each layer's stages run (vlbench.pipeline)."""

from stages.common import parser, run
from vlbench.io import atomic_path
from vlbench.pipeline import CODE_DIR, LAYERS, fingerprint


def main() -> None:
    parser(__doc__, dataset=False).parse_args()
    CODE_DIR.mkdir(parents=True, exist_ok=True)
    for layer in LAYERS:
        with atomic_path(CODE_DIR / f"{layer}.txt") as tmp:
            tmp.write_text(fingerprint(layer))
    print(f"code: {len(LAYERS)} layer fingerprints in {CODE_DIR}")


if __name__ == "__main__":
    run(main)
