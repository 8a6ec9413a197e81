"""The course as a static website: `make site` (build.py), its map's data (course.py), Sphinx's conf.py."""
