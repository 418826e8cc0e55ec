"""Keep the terminal for progress and results: no framework banners, tips or deprecation chatter. Used by the CLI
commands and by every Ray Tune trial."""

from __future__ import annotations

import logging
import os
import warnings


def quiet_frameworks() -> None:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*weights_only.*")
    warnings.filterwarnings("ignore", message=".*module\\(s\\) in eval mode.*")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import pytorch_lightning  # noqa: F401  (configures its loggers on import; quiet them afterwards)

    for name in ("pytorch_lightning", "lightning_fabric", "lightning.pytorch"):
        logging.getLogger(name).setLevel(logging.ERROR)
