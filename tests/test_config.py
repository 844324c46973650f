"""The Loader's options: public dataclasses per concern, one spelling each, the CLI built from them."""

import argparse
import dataclasses

import numpy as np
import pytest
from helpers import paired_source

import steadyfeed as sf
from steadyfeed.config import GROUPS, OPTION_GROUPS, LoaderConfig
from steadyfeed.tools.spec import LOADER_FLAGS, add_spec_arguments, loader_options


def test_every_option_has_one_group_and_documentation():
    names = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls)]
    assert len(names) == len(set(names)) == len(OPTION_GROUPS)  # one spelling, one place
    for cls in GROUPS.values():
        for f in dataclasses.fields(cls):
            assert f.metadata["doc"] and f.name in cls.__doc__, f"{cls.__name__}.{f.name} is undocumented"


def test_flat_keywords_groups_and_a_whole_config_give_the_same_loader():
    flat = sf.Loader(paired_source(10), 4, shuffle=True, seed=3, workers=2, on_error="skip", shard_count=2)
    grouped = sf.Loader(
        paired_source(10),
        read=sf.ReadOptions(batch_size=4, shuffle=True, seed=3),
        execution=sf.ExecutionOptions(workers=2),
        failure=sf.FailureOptions(on_error="skip"),
        sharding=sf.ShardOptions(shard_count=2),
    )
    whole = sf.Loader(paired_source(10), config=flat.config)
    assert flat.config == grouped.config == whole.config
    assert LoaderConfig.build(**flat.config.options()) == flat.config
    assert flat.config.execution.workers == 2 and flat.config.failure.on_error == "skip"


def test_a_config_is_a_base_that_keywords_override():
    base = LoaderConfig.build(batch_size=8, workers=2)
    loader = sf.Loader(paired_source(10), config=base, mode="process", batch_size=5)
    assert (loader.config.read.batch_size, loader.config.execution.mode, loader.config.execution.workers) == (
        5,
        "process",
        2,
    )
    assert loader.replace(workers=0).config.execution == sf.ExecutionOptions(workers=0, mode="process")


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(wrokers=2), TypeError, r"'wrokers' \(did you mean 'workers'\?\)"),
        (dict(execution=sf.ExecutionOptions(workers=2), workers=3), TypeError, "workers given both"),
        (dict(execution=sf.FailureOptions()), TypeError, "execution must be a ExecutionOptions"),
        (dict(timeout=1.0), ValueError, "timeout needs workers"),  # a rule across two groups
    ],
)
def test_wrong_options_are_refused_naming_what_is_wrong(kwargs, error, match):
    with pytest.raises(error, match=match):
        sf.Loader(paired_source(4), 2, **kwargs)


def test_batch_size_is_required():
    with pytest.raises(TypeError, match="batch_size is required"):
        sf.Loader(paired_source(4))


def test_drop_last_is_deprecated_for_last_batch():
    with pytest.warns(DeprecationWarning, match="last_batch='drop'"):
        loader = sf.Loader(paired_source(10), 4, drop_last=True)
    assert loader.config.read.last_batch == "drop" and len(loader) == 2
    with pytest.warns(DeprecationWarning):
        assert sf.Loader(paired_source(10), 4, drop_last=False).config.read.last_batch == "partial"


def test_numpy_integers_are_accepted_where_ints_are():
    loader = sf.Loader(paired_source(10), np.int64(4), seed=np.int64(2), workers=np.int32(0))
    assert len(loader) == 3


def parse(*argv, exclude=()):
    parser = argparse.ArgumentParser()
    add_spec_arguments(parser, exclude=exclude)
    return parser.parse_args(list(argv))


def test_the_cli_flags_are_the_fields():
    cli_fields = [f.name for cls in GROUPS.values() for f in dataclasses.fields(cls) if f.metadata["cli"]]
    assert list(LOADER_FLAGS) == cli_fields and {"transform", "sampler"}.isdisjoint(LOADER_FLAGS)
    args = parse(
        "x.py:f",
        "--workers",
        "3",
        "--mode",
        "process",
        "--no-shuffle",
        "--max-error-fraction",
        "0.5",
        "--timeout",
        "2.5",
        "--last-batch",
        "pad",
        "--inline-when-faster",
    )
    assert loader_options(args) == {
        "workers": 3,
        "mode": "process",
        "shuffle": False,
        "max_error_fraction": 0.5,
        "timeout": 2.5,
        "last_batch": "pad",
        "inline_when_faster": True,
    }
    assert loader_options(parse("x.py:f")) == {}  # a flag not given changes nothing
    with pytest.raises(SystemExit):
        parse("x.py:f", "--mode", "fork")  # choices come from the field's Literal type
    assert not hasattr(parse("x.py:f", exclude=("workers",)), "workers")
    assert loader_options(parse("x.py:f", "--workers", "auto")) == {"workers": "auto"}
    with pytest.raises(SystemExit):
        parse("x.py:f", "--workers", "many")


def test_the_command_line_reads_unset_workers_as_auto():
    from steadyfeed.tools.spec import as_loader

    assert as_loader(paired_source(8), {}, "x").config.execution.workers == "auto"
    assert as_loader(paired_source(8), {"workers": 1}, "x").config.execution.workers == 1
    assert as_loader(sf.Loader(paired_source(8), 2), {}, "x").config.execution.workers == "auto"
    assert as_loader(sf.Loader(paired_source(8), 2, workers=0), {}, "x").config.execution.workers == 0


def test_the_deprecated_cli_spelling_still_works(capsys):
    assert loader_options(parse("x.py:f", "--drop-last")) == {"last_batch": "drop"}
    assert "--drop-last is deprecated" in capsys.readouterr().err


def test_mode_ray_without_ray_is_refused_when_the_loader_is_built(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'steadyfeed\[ray\]', or use mode='thread'"):
        sf.Loader(paired_source(8), 4, workers=2, mode="ray")
    sf.Loader(paired_source(8), 4, workers=0, mode="ray").close()  # no workers: Ray is never used
