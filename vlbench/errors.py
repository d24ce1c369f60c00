"""The errors a user can cause and fix (bad params, data, weights): stages print these as one line."""

from vlbench.config import ParamsError
from vlbench.datasets.canonical import DatasetError
from vlbench.embed import CorruptImageError
from vlbench.features import StaleFeaturesError
from vlbench.models.loading import ModelError

USER_ERRORS = (ParamsError, DatasetError, CorruptImageError, StaleFeaturesError, ModelError, FileNotFoundError)
