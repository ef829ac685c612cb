"""The package version: the meson project's (meson.build checks that the two agree)."""
__version__ = '0.1.0'
