"""The terminal loop on the standard library's curses: it repaints only the cells that changed
(ncurses diffs the screen), sleeps in getch() between refreshes, and costs no dependency
(bench/RESULTS.md, "gpu-spatial top": CPU at 1 s refresh)."""
from __future__ import annotations

import curses
import time

from gpu_spatial.top.render import SORTS, View, render

COLOURS = {  # style -> (foreground, extra attribute)
    "fill": (curses.COLOR_GREEN, 0), "hidden": (curses.COLOR_RED, curses.A_BOLD), "time": (curses.COLOR_CYAN, 0),
    "sm": (curses.COLOR_GREEN, curses.A_BOLD), "bad": (curses.COLOR_RED, curses.A_BOLD),
    "na": (curses.COLOR_YELLOW, 0), "mps": (curses.COLOR_MAGENTA, curses.A_BOLD),
    "verdict": (curses.COLOR_YELLOW, curses.A_BOLD),
}
PLAIN = {"sel": curses.A_REVERSE, "header": curses.A_REVERSE, "title": curses.A_BOLD, "bold": curses.A_BOLD,
         "bad": curses.A_BOLD, "verdict": curses.A_BOLD, "dim": curses.A_DIM}


class Refused(Exception):
    """The URL given is not an exporter top can read (a Prometheus, an exporter with --no-api)."""


def attributes(colour: bool) -> dict[str, int]:
    attrs = dict(PLAIN)
    if colour and curses.has_colors():
        curses.start_color()
        try:
            curses.use_default_colors()
            background = -1
        except curses.error:
            background = curses.COLOR_BLACK
        for number, (style, (fg, extra)) in enumerate(COLOURS.items(), start=1):
            curses.init_pair(number, fg, background)
            attrs[style] = curses.color_pair(number) | extra
    return attrs


def handle_key(key: int, view: View, gpus: int) -> bool:
    """Applies one key to the view; False to quit."""
    if view.page != "main":  # any key leaves help and why (q still quits)
        view.page = "main"
        return key not in (ord("q"), ord("Q"))
    if key in (ord("q"), ord("Q")):
        return False
    if key in (curses.KEY_DOWN, ord("j")):
        view.selected = min(view.selected + 1, max(gpus - 1, 0))
    elif key in (curses.KEY_UP, ord("k")):
        view.selected = max(view.selected - 1, 0)
    elif ord("0") <= key <= ord("9") and key - ord("0") < gpus:
        view.selected = key - ord("0")
    elif key in (ord("s"), ord(">"), ord("<")):
        step = -1 if key == ord("<") else 1
        view.sort = SORTS[(SORTS.index(view.sort) + step) % len(SORTS)]
    elif key == ord("i"):
        view.reverse = not view.reverse
    elif key == ord("?"):
        view.page = "help"
    elif key == ord("w"):
        view.page = "why"
    return True


def paint(screen, lines, attrs) -> None:
    screen.erase()
    for y, line in enumerate(lines):
        x = 0
        for text, style in line:
            try:
                screen.addstr(y, x, text, attrs.get(style, 0))
            except curses.error:  # the bottom-right cell: curses writes it, then complains
                pass
            x += len(text)
    screen.noutrefresh()
    curses.doupdate()


def run(feed, interval: float, colour: bool, log_lines) -> int:
    def loop(screen) -> int:
        try:
            curses.curs_set(0)
        except curses.error:
            pass
        attrs = attributes(colour)
        view = View()
        next_draw = 0.0
        while True:
            now = time.monotonic()
            if now >= next_draw:
                state = feed.state()
                if state.refused:  # a URL no retry helps: said once the terminal is restored
                    raise Refused(state.problem)
                view.log = tuple(log_lines)
                height, width = screen.getmaxyx()
                paint(screen, render(state, view, width, height), attrs)
                next_draw = now + interval
            screen.timeout(max(10, int((next_draw - time.monotonic()) * 1000)))
            key = screen.getch()
            if key == -1:
                continue
            if key != curses.KEY_RESIZE and not handle_key(key, view, len(state.gpus)):
                return 0
            next_draw = 0.0  # a key or a resize repaints at once

    return curses.wrapper(loop)
