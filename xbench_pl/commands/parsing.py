"""What every command's jsonargparse parser is built with (the modules that build one import this; the
dispatcher does not, so ``python -m xbench_pl --help`` starts without jsonargparse)."""

from __future__ import annotations

from jsonargparse import DefaultHelpFormatter

from xbench_pl.commands.arguments import plain


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help (types, defaults) with the markup of the docstrings it quotes removed."""

    def _expand_help(self, action) -> str:
        return plain(super()._expand_help(action))

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def start_section(self, heading: str | None) -> None:  # a class's options are headed by its docstring
        super().start_section(plain(heading) if heading else heading)


#: errors are raised (the dispatcher prints one line); an option must be spelled out in full (no prefix
#: matching: ``--trainer.max_epoch`` is refused, not taken for ``max_epochs``); help without markup
PARSER_KWARGS = {"exit_on_error": False, "allow_abbrev": False, "formatter_class": PlainHelpFormatter}
