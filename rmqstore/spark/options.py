"""Option parsing shared by the rocketmq source and writer: Spark passes every option as a
string, under its name lower-cased."""
from rmqstore.arguments import decimal_int
from rmqstore.errors import InvalidArgumentError


def check_options(options, valid, what):
    """InvalidArgumentError naming an option of ``options`` that ``valid`` does not name
    (in any case), and listing the valid ones: a typo (``chekCrc``) was ignored silently."""
    known = {name.lower() for name in valid}
    unknown = sorted(k for k in options if k.lower() not in known)
    if unknown:
        raise InvalidArgumentError(f"rocketmq {what}: unknown option(s) {unknown}; the options are "
                                   f"{', '.join(valid)} (in any case)")


def list_option(options, name):
    """Option ``name`` (comma-separated names) as a tuple, each name stripped of blanks
    (``"TA, TB"`` is TA and TB); None when absent. A blank name (``"TA,,TB"``, ``""``) or
    a name given twice is an InvalidArgumentError naming it."""
    if name not in options:
        return None
    text = str(options[name])
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise InvalidArgumentError(f"rocketmq source: option {name} {text!r}: name {names.index('') + 1} is blank")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise InvalidArgumentError(f"rocketmq source: option {name} names {twice} twice")
    return names


def int_option(options, name, default, lo):
    """Option ``name`` (a string, as Spark passes them) as an int in lo..2^62 written in
    ASCII digits; ``default`` when absent. InvalidArgumentError names the option (int()
    raised a bare ValueError, or took "1_0" and " 12")."""
    text = options.get(name)
    if text is None:
        return default
    v = decimal_int(str(text))
    if v is None or not lo <= v <= 1 << 62:
        raise InvalidArgumentError(f"rocketmq source: option {name} must be an integer in {lo}..{1 << 62}, "
                                   f"not {str(text)!r}")
    return v


def bool_option(options, name):
    """Option ``name`` as true or false (any case; absent: false), not anything else."""
    text = str(options.get(name, "false")).lower()
    if text not in ("true", "false"):
        raise InvalidArgumentError(f"rocketmq source: option {name} must be true or false, not {text!r}")
    return text == "true"
