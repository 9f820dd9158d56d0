"""Inside an actor's methods the actor class's name works as the user's
class does (``MyActor.LIMIT``, static and class methods), as in Ray, where
the actor class derives from the user's class; ``dir()`` of an actor class
lists the class's attributes and methods, ``dir()`` of a handle its methods
(Ray's test_actor*.py)."""

from __future__ import annotations

import pytest

import tray


@tray.remote
class Box:
    LIMIT = 10

    def __init__(self, start=0):
        self.value = start

    def add(self, amount=1):
        # The class's name is the actor class here: its attributes work.
        self.value = min(self.value + amount, Box.LIMIT)
        return self.value

    @staticmethod
    def double(x):
        return 2 * x

    @classmethod
    def describe(cls):
        return f"{cls.__name__} up to {cls.LIMIT}"

    def through_static(self, x):
        return Box.double(x)

    def through_class(self):
        return Box.describe()


def test_actor_methods_see_their_class_attributes(one_node):
    box = Box.remote(8)
    assert tray.get(box.add.remote(5)) == 10  # capped by Box.LIMIT
    assert tray.get(box.through_static.remote(21)) == 42
    assert tray.get(box.through_class.remote()) == "Box up to 10"
    assert tray.get(box.double.remote(4)) == 8  # a static method called remotely
    # ... and in the driver, as in Ray, through the actor class.
    assert Box.LIMIT == 10 and Box.double(3) == 6


def test_dir_of_actor_class_and_handle(one_node):
    listed = dir(Box)
    for name in ("add", "double", "describe", "through_static", "LIMIT", "remote", "options"):
        assert name in listed, name
    handle_listed = dir(Box.remote())
    assert {"add", "double", "through_static", "through_class"} <= set(handle_listed)
    assert not [name for name in handle_listed if name.startswith("__")]


def test_actor_class_attribute_errors_stay_clear():
    with pytest.raises(AttributeError, match="no_such"):
        Box.no_such  # noqa: B018
    with pytest.raises(TypeError, match=r"\.remote"):
        Box()



def test_the_class_loads_where_its_module_cannot_be_imported(tmp_path):
    # Regression: once the actor class forwarded the user's attributes,
    # cloudpickle found `module.Counter.add` leading back to the method and
    # pickled it by reference, so a worker that could not import the module
    # (a test file or a script run against `tray start`) failed to create
    # the actor ("No module named ...").
    import subprocess
    import sys
    import textwrap

    import cloudpickle

    (tmp_path / "only_here.py").write_text(textwrap.dedent("""
        import tray

        @tray.remote
        class Counter:
            LIMIT = 3

            def __init__(self):
                self.n = 0

            def add(self, k):
                self.n += k
                return min(self.n, Counter.LIMIT)
    """))
    sys.path.insert(0, str(tmp_path))
    try:
        import only_here

        blob = cloudpickle.dumps(only_here.Counter._cls)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_here", None)
    (tmp_path / "class.pickle").write_bytes(blob)
    loader = ("import pickle, sys\n"
              "cls = pickle.loads(open(sys.argv[1], 'rb').read())\n"
              "print(cls().add(2))")
    done = subprocess.run([sys.executable, "-c", loader, str(tmp_path / "class.pickle")],
                          capture_output=True, text=True, timeout=60, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2"
