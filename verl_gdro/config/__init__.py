"""Package Hydra configs (``--config-path=pkg://verl_gdro.config``); a package so Hydra can find it."""
