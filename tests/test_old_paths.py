"""The module paths from before the package had rooms still import, as the same modules."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from scrapy.utils.misc import load_object

import scrapy_retryqueue
from scrapy_retryqueue._moved import MOVED

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_is_the_moved_module_itself(old: str, new: str) -> None:
    moved = importlib.import_module(new)
    assert importlib.import_module(old) is moved
    # The alias does not take the module's identity: relative imports inside it and
    # importlib.reload go on working from its own name.
    assert moved.__spec__.name == new
    assert moved.__name__ == new


def test_every_old_path_names_a_module_that_exists_now() -> None:
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None, new
    # An old path is never also a module of its own (a file left behind would shadow it).
    for old in MOVED:
        parts = old.split(".")
        assert not ROOT.joinpath(*parts).with_suffix(".py").exists(), old


def test_the_old_from_import_style_gives_the_moved_modules() -> None:
    from scrapy_retryqueue import defaults, kinds, middleware

    assert kinds is importlib.import_module("scrapy_retryqueue.decision.kinds")
    assert defaults is importlib.import_module("scrapy_retryqueue.settings.defaults")
    assert middleware is importlib.import_module("scrapy_retryqueue.crawl.middleware")


def test_component_paths_projects_write_in_settings_still_load() -> None:
    from scrapy_retryqueue.crawl.frontier import FrontierDupeFilter, LeasedScheduler
    from scrapy_retryqueue.crawl.middleware import RetryQueueMiddleware
    from scrapy_retryqueue.decision.backoff import ExponentialBackoff

    assert load_object("scrapy_retryqueue.frontier.LeasedScheduler") is LeasedScheduler
    assert load_object("scrapy_retryqueue.frontier.FrontierDupeFilter") is FrontierDupeFilter
    assert load_object("scrapy_retryqueue.middleware.RetryQueueMiddleware") is RetryQueueMiddleware
    assert load_object("scrapy_retryqueue.backoff.ExponentialBackoff") is ExponentialBackoff
    assert load_object("scrapy_retryqueue.LearnedBackoff").__module__ == (
        "scrapy_retryqueue.decision.learned"
    )


def test_the_queue_and_view_packages_answer_their_old_modules_names() -> None:
    from scrapy_retryqueue.queue import delayed
    from scrapy_retryqueue.view import live

    assert scrapy_retryqueue.queue.RedisDelayedQueue is delayed.RedisDelayedQueue
    assert scrapy_retryqueue.queue.Write is delayed.Write
    assert scrapy_retryqueue.view.counts is live.counts
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        scrapy_retryqueue.queue.nothing  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        scrapy_retryqueue.view.nothing  # noqa: B018


def test_an_unknown_path_is_still_an_import_error() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("scrapy_retryqueue.nothing_here")


def _loaded(code: str) -> list[str]:
    probe = (
        f"import json, sys\n{code}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('scrapy_retryqueue'))))"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_submodule_of_the_queue_package_does_not_load_the_old_modules_names() -> None:
    # The package answers the old module's names lazily: importing one of its
    # submodules by name must not load the delayed queue (and its Redis client).
    loaded = _loaded("from scrapy_retryqueue.queue import keys")
    assert "scrapy_retryqueue.queue.keys" in loaded
    assert "scrapy_retryqueue.queue.delayed" not in loaded
    loaded = _loaded("from scrapy_retryqueue.view import status")
    assert "scrapy_retryqueue.view.live" in loaded  # status reads the live view itself
    assert "scrapy_retryqueue.crawl.middleware" not in loaded


def test_an_old_path_loads_one_copy_of_its_module() -> None:
    code = (
        "import scrapy_retryqueue.kinds, scrapy_retryqueue.decision.kinds\n"
        "assert sys.modules['scrapy_retryqueue.kinds'] is "
        "sys.modules['scrapy_retryqueue.decision.kinds']"
    )
    assert "scrapy_retryqueue.decision.kinds" in _loaded(code)


def test_the_lazy_name_lists_match_the_modules_they_answer_for() -> None:
    # queue/__init__ and view/__init__ list the old modules' names by hand (reading
    # them from the module would load it): a name added to delayed.py or live.py
    # without its line there would not resolve under the old path.
    from scrapy_retryqueue import queue
    from scrapy_retryqueue.queue import delayed

    assert set(queue._DELAYED) == set(delayed.__all__)
