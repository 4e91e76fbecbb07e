"""Each accounting module logs under its own name, so that a site's logging settings for
llmgwd.accounting (or one module of it) reach its lines."""

from __future__ import annotations

import importlib
import logging
import pkgutil

import llmgwd.accounting


def test_every_accounting_logger_is_named_after_its_module() -> None:
    seen = 0
    for info in pkgutil.iter_modules(llmgwd.accounting.__path__):
        module = importlib.import_module(f"llmgwd.accounting.{info.name}")
        log = getattr(module, "log", None)
        if isinstance(log, logging.Logger):
            assert log.name == module.__name__
            seen += 1
    assert seen >= 2  # usage and allotments log
