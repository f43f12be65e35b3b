"""Thin, idempotent steps against one external system each; clients come in the constructor."""
