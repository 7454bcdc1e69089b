"""The plugin system: the seams (``seams``) and their hook specifications (``hookspecs``), discovery of
installed plugins (``discovery``), the registry of their components (``registry``) and the checks a
registration and a built component must pass (``checks``)."""
