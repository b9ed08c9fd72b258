"""``chattts-serve``: the command line, the top layer, above the Ray layer (``deployments/``) whose
bulk synthesis it runs: ``cli.py`` (its subcommands), ``say.py`` (``say``)."""
