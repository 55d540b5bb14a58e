"""The repository's shape: module and function sizes, no import cycles, design citations
that resolve, README length, packaging metadata that agrees with requirements.txt."""
import ast
import os
import re
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60
MAX_README_LINES = 300


def _python_files(folder):
  for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
    for name in sorted(files):
      if name.endswith(".py"):
        yield os.path.join(dirpath, name)


def _module_name(path):
  rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
  return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _mot_imports(path):
  """(imported mot module, line, whether at module top level) of every import in a file."""
  tree = ast.parse(open(path).read())
  known = {_module_name(p) for p in _python_files("mot")}
  top = {id(node) for node in tree.body}
  out = []
  for node in ast.walk(tree):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      # `from mot import x` imports the module mot.x when there is one, else a name of mot.
      names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
               else node.module for a in node.names]
    for name in names:
      if name in known:
        out.append((name, node.lineno, id(node) in top))
  return out


def test_modules_are_at_most_600_lines():
  long = {os.path.relpath(p, ROOT): n for p in _python_files("mot")
          if (n := len(open(p).read().splitlines())) > MAX_MODULE_LINES}
  assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_functions_are_at_most_60_lines():
  long = []
  for folder in ("mot", "configs"):
    for path in _python_files(folder):
      for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
          n = node.end_lineno - node.lineno + 1
          exempt = folder == "configs" and node.name == "get_config"
          if n > MAX_FUNCTION_LINES and not exempt:
            long.append(f"{os.path.relpath(path, ROOT)}:{node.name} ({n})")
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"


def test_no_import_cycles_in_mot():
  graph = {_module_name(p): {m for m, _, _ in _mot_imports(p)} - {_module_name(p)}
           for p in _python_files("mot")}
  index, low, stack, on_stack, cycles = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        cycles.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  assert not cycles, f"import cycles: {cycles}"


def test_lazy_imports_say_why():
  unexplained = []
  for path in _python_files("mot"):
    lines = open(path).read().splitlines()
    for node in ast.walk(ast.parse("\n".join(lines))):
      if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset > 0:
        line = lines[node.lineno - 1]
        guarded = lines[node.lineno - 2].strip().startswith("if __name__") if node.lineno > 1 \
            else False
        reason = line.split("#", 1)[1].strip() if "#" in line else ""
        if (not reason or reason.startswith("pylint")) and not guarded:
          unexplained.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
  assert not unexplained, f"imports inside functions without a one-line reason: {unexplained}"


def _private_uses(path):
  """Private names a file reaches in another object: `module._name`, `from mot.x import _name`,
  and calls `obj._name(...)` on anything but self/cls (a private method is its class's own)."""
  tree = ast.parse(open(path).read())
  aliases = {a.asname or a.name.split(".")[-1] for node in ast.walk(tree)
             if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
  where = os.path.relpath(path, ROOT)
  found = []
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
        and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
        and node.value.id in aliases):
      found.append(f"{where}:{node.lineno} {node.value.id}.{node.attr}")
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr.startswith("_") and not node.func.attr.startswith("__")
          and not (isinstance(node.func.value, ast.Name)
                   and node.func.value.id in ("self", "cls", *aliases))
          and node.func.attr != "_replace"):  # NamedTuple's public API despite the underscore
      found.append(f"{where}:{node.lineno} {ast.unparse(node.func)}(")
    if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mot"):
      found += [f"{where}:{node.lineno} {a.name}" for a in node.names if a.name.startswith("_")]
  return found


def test_no_private_names_used_across_mot_modules():
  """The library, benches and entry points use one another only through public names, so a
  private name can change without breaking a caller elsewhere (tests may reach inside)."""
  paths = [*_python_files("mot"), *_python_files("bench"),
           *(os.path.join(ROOT, name) for name in ("train.py", "sample.py"))]
  crossing = [use for path in paths for use in _private_uses(path)]
  assert not crossing, f"private names used from another module: {crossing}"


def test_every_design_citation_is_a_heading_of_docs_design():
  headings = set(re.findall(r"^## (\d+)\. ", open(os.path.join(ROOT, "docs", "design.md")).read(),
                            re.M))
  cited = {}
  for folder in ("mot", "configs", "bench", "tests", "docs"):
    for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
      for name in files:
        if name.endswith((".py", ".md")):
          path = os.path.join(dirpath, name)
          for n in re.findall(r"(?:DESIGN|design\.md) §(\d+)", open(path).read()):
            cited.setdefault(n, os.path.relpath(path, ROOT))
  readme = open(os.path.join(ROOT, "README.md")).read()
  for n in re.findall(r"(?:DESIGN|design\.md) §(\d+)", readme):
    cited.setdefault(n, "README.md")
  assert cited, "no citation found: the pattern is wrong"
  missing = {n: where for n, where in cited.items() if n not in headings}
  assert not missing, f"cited sections with no '## N. Title' heading in docs/design.md: {missing}"


def test_readme_is_a_short_guide():
  lines = open(os.path.join(ROOT, "README.md")).read().splitlines()
  assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines"


def test_pyproject_dependencies_are_requirements_txt():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
  pins = [line.split("#")[0].strip() for line in open(os.path.join(ROOT, "requirements.txt"))]
  assert sorted(deps) == sorted(p for p in pins if p), "pyproject.toml and requirements.txt differ"


def test_bench_flags_are_defined_only_when_run():
  """Tests import several bench modules into one process; flags defined at import would
  collide (absl's DuplicateFlagError), so each bench defines its flags in define_flags()."""
  at_import = []
  for path in _python_files("bench"):
    for node in ast.parse(open(path).read()).body:
      call = node.value if isinstance(node, (ast.Expr, ast.Assign)) else None
      if isinstance(call, ast.Call) and re.match(r"(config_)?flags\.DEFINE",
                                                 ast.unparse(call.func)):
        at_import.append(f"{os.path.relpath(path, ROOT)}:{node.lineno}")
  assert not at_import, f"flags defined at import time: {at_import}"
