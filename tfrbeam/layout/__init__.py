"""The home of the dataset directory: its names, the confinement of paths inside it, its manifest's schema.

Below Beam (never imports apache_beam) and below the readers: every tool that reads a dataset
asks this package which paths a manifest may name (``paths``), whether a manifest is well formed
(``manifest_schema``) and whether the dataset is still the generation it started reading
(``generation``). See docs/trust.md.
"""
