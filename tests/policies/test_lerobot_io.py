"""LeRobot's normaliser read from a policy folder's own files (rlvla3/policies/pi/layout.py):
statistics round-trip, each mode maps as LeRobot does, and a missing piece is named."""
from __future__ import annotations

import json

import numpy as np
import pytest

from rlvla3.policies.pi.layout import Normaliser, read_normaliser, write_normaliser

STATS = {"observation.state": {"q01": np.array([-1.0, 0.0], np.float32), "q99": np.array([1.0, 4.0], np.float32),
                               "mean": np.array([0.0, 2.0], np.float32), "std": np.array([0.5, 1.0], np.float32)},
         "action": {"q01": np.array([-0.2, -0.2, 0.0], np.float32), "q99": np.array([0.2, 0.6, 1.0], np.float32)}}
FEATURES = {"observation.state": "STATE", "action": "ACTION", "observation.images.base_0_rgb": "VISUAL"}


def test_quantile_stats_round_trip_through_the_folder_and_map_q01_q99_to_minus_one_one(tmp_path):
    write_normaliser(tmp_path, Normaliser(FEATURES, {"STATE": "QUANTILES", "ACTION": "QUANTILES", "VISUAL": "IDENTITY"}, STATS))
    steps = json.loads((tmp_path / "policy_preprocessor.json").read_text())["steps"]
    assert steps[3]["state_file"] == "policy_preprocessor_step_3_normalizer_processor.safetensors"
    norm = read_normaliser(tmp_path)
    assert np.array_equal(norm.stats["action"]["q99"], STATS["action"]["q99"])
    a = np.array([[-0.2, -0.2, 0.0], [0.2, 0.6, 1.0], [0.0, 0.2, 0.5]], np.float32)
    y = norm.normalise("action", a)
    assert np.allclose(y[0], -1) and np.allclose(y[1], 1) and np.allclose(y[2], 0)
    assert np.allclose(norm.unnormalise("action", y), a, atol=1e-6)
    assert np.allclose(norm.normalise("action", np.array([0.4, 0.6, 1.0])), [2, 1, 1])   # not clipped
    img = np.ones((3, 4, 4))
    assert norm.normalise("observation.images.base_0_rgb", img) is img


def test_mean_std_mode_and_a_step_found_by_name_not_index(tmp_path):
    write_normaliser(tmp_path, Normaliser(FEATURES, {"STATE": "MEAN_STD"}, STATS), index=2)
    norm = read_normaliser(tmp_path)
    s = np.array([1.0, 3.0])
    assert np.allclose(norm.normalise("observation.state", s), [2.0, 1.0])
    assert np.allclose(norm.unnormalise("observation.state", norm.normalise("observation.state", s)), s)


def test_missing_stats_files_and_features_are_named(tmp_path):
    write_normaliser(tmp_path / "base", Normaliser(FEATURES, {"ACTION": "QUANTILES"}))   # a base checkpoint: no stats
    with pytest.raises(KeyError, match="no 'q01' statistics for 'action'"):
        read_normaliser(tmp_path / "base").normalise("action", np.zeros(3))
    with pytest.raises(KeyError, match="no feature 'observation.wrist'"):
        read_normaliser(tmp_path / "base").normalise("observation.wrist", np.zeros(3))
    with pytest.raises(FileNotFoundError, match="no policy_postprocessor.json"):
        read_normaliser(tmp_path / "base", "policy_postprocessor")
    write_normaliser(tmp_path / "ft", Normaliser(FEATURES, {"ACTION": "QUANTILES"}, STATS))
    (tmp_path / "ft" / "policy_preprocessor_step_3_normalizer_processor.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="policy_preprocessor_step_3_normalizer_processor.safetensors"):
        read_normaliser(tmp_path / "ft")
