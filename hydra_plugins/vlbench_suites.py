"""A Hydra plugin that checks a suite file's format while `dvc exp run -S suite=<name>` composes conf/.

DVC composes params.yaml with Hydra before any stage runs, after loading Hydra plugins from its `hydra.plugins_path`
(default: the repository root, so this `hydra_plugins` namespace package). A suite written the Hydra way (`defaults:
- /dataset@datasets.x: x`) composes, but puts a whole entry where dvc.yaml expects an input path, and DVC then stops
with "Cannot interpolate data of type 'dict'". Here conf/ is read through the `vlbench://` config source, which is
conf/'s own files with two additions: a file of the `suite` group is checked as it is loaded
(`vlbench.conf.check_suite_format`), so DVC stops with one line that names the suite file and shows the format; and
its `entries` get a key for each of its datasets (`vlbench.conf.with_every_entry`: `{}` where the suite changes
nothing), the params `suite.entries.<name>` that prepare@<name>, texts@<name> and knowledge@<name> depend on.
`vlbench compose` does the same itself.
"""

import os

from hydra._internal.core_plugins import file_config_source
from hydra.core import config_search_path
from hydra.plugins import search_path_plugin
from omegaconf import OmegaConf


class VlbenchSuiteSource(file_config_source.FileConfigSource):
    """conf/'s files (Hydra's file source), each suite file checked as it is loaded."""

    @staticmethod
    def scheme() -> str:
        return "vlbench"

    def load_config(self, config_path: str):
        from vlbench.conf import check_suite_format, with_every_entry
        from vlbench.errors import VlbenchError

        result = super().load_config(config_path)
        if config_path.startswith("suite/"):
            where = os.path.relpath(os.path.join(self.path, self._normalize_file_name(config_path)))
            global_package = (result.header or {}).get("package") == "_global_"
            try:
                check_suite_format(OmegaConf.to_container(result.config, resolve=False), where, global_package)
            except VlbenchError as err:
                raise _as_dvc_error(err) from None
            suite = result.config.get("suite") if global_package else result.config
            if suite is not None and suite.get("datasets"):
                suite.entries = with_every_entry(OmegaConf.to_container(suite, resolve=False))
        return result


class VlbenchSuitePath(search_path_plugin.SearchPathPlugin):
    """Reads a vlbench conf/ (the primary config folder, with `suite/` and `dataset/`) through `vlbench://`."""

    def manipulate_search_path(self, search_path) -> None:
        for element in list(search_path.get_path()):
            folder = element.path.removeprefix("file://")  # initialize_config_dir gives a plain path
            if element.provider == "main" and "://" not in folder and \
                    os.path.isdir(os.path.join(folder, "suite")) and os.path.isdir(os.path.join(folder, "dataset")):
                search_path.prepend("vlbench", f"vlbench://{folder}",
                                    anchor=config_search_path.SearchPathQuery(provider="main"))
                return


def _as_dvc_error(err: Exception) -> Exception:
    """Inside DVC, an error DVC prints as `ERROR: <message>` (not as an "unexpected error"); elsewhere `err`."""
    try:
        from dvc.exceptions import InvalidArgumentError
    except ImportError:
        return err
    return InvalidArgumentError(str(err))
