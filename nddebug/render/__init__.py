"""Renderers: present a Report as terminal text or HTML; they compute nothing."""
