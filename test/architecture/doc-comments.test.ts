// The public surface of each folder of src/ is what other folders import
// from it; each such export carries a `/** */` comment, the one an editor
// shows on hover. What a folder keeps to itself may go without.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { dirname, join, normalize, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const SRC = fileURLToPath(new URL('../../src/', import.meta.url));
// Every export of a module that another folder loads with import().
const WHOLE_MODULE = '*';

function sourceFiles(): string[] {
  return readdirSync(SRC, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && e.name.endsWith('.ts'))
    .map((e) => relative(SRC, join(e.parentPath, e.name)))
    .sort();
}

function parse(file: string, text = readFileSync(join(SRC, file), 'utf8')): ts.SourceFile {
  return ts.createSourceFile(file, text, ts.ScriptTarget.Latest, true);
}

/** The names each file's exports are imported by from other folders. */
function importedAcrossFolders(files: ReadonlyMap<string, ts.SourceFile>): Map<string, Set<string>> {
  const used = new Map<string, Set<string>>();
  const note = (from: string, spec: string, names: Iterable<string>): void => {
    if (!spec.startsWith('.')) return;
    const target = normalize(join(dirname(from), spec));
    if (dirname(target) === dirname(from)) return;
    const set = used.get(target) ?? new Set<string>();
    for (const n of names) set.add(n);
    used.set(target, set);
  };
  for (const [file, sf] of files) {
    const visit = (node: ts.Node): void => {
      if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
        const clause = node.importClause;
        const names: string[] = [];
        if (clause?.name) names.push('default');
        const bindings = clause?.namedBindings;
        if (bindings && ts.isNamedImports(bindings))
          for (const e of bindings.elements) names.push((e.propertyName ?? e.name).text);
        if (bindings && ts.isNamespaceImport(bindings)) names.push(WHOLE_MODULE);
        note(file, node.moduleSpecifier.text, names);
      } else if (ts.isExportDeclaration(node) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
        const clause = node.exportClause;
        const names =
          clause && ts.isNamedExports(clause)
            ? clause.elements.map((e) => (e.propertyName ?? e.name).text)
            : [WHOLE_MODULE];
        note(file, node.moduleSpecifier.text, names);
      } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
        const arg = node.arguments[0];
        if (arg && ts.isStringLiteral(arg)) note(file, arg.text, [WHOLE_MODULE]);
      }
      ts.forEachChild(node, visit);
    };
    visit(sf);
  }
  return used;
}

/** `file: name` of each export in `used` that has no `/** *\/` comment. */
function undocumented(sf: ts.SourceFile, used: ReadonlySet<string>): string[] {
  const missing: string[] = [];
  for (const statement of sf.statements) {
    const modifiers = ts.canHaveModifiers(statement) ? ts.getModifiers(statement) : undefined;
    if (!modifiers?.some((m) => m.kind === ts.SyntaxKind.ExportKeyword)) continue;
    const names = ts.isVariableStatement(statement)
      ? statement.declarationList.declarations.map((d) => d.name.getText(sf))
      : 'name' in statement && statement.name && ts.isIdentifier(statement.name as ts.Node)
        ? [(statement.name as ts.Identifier).text]
        : [];
    const documented = ts.getJSDocCommentsAndTags(statement).some((d) => ts.isJSDoc(d));
    for (const name of names)
      if (!documented && (used.has(name) || used.has(WHOLE_MODULE))) missing.push(`${sf.fileName}: ${name}`);
  }
  return missing;
}

test('every export another folder imports has a doc comment', () => {
  const files = new Map(sourceFiles().map((f) => [f, parse(f)]));
  const used = importedAcrossFolders(files);
  const missing = [...files].flatMap(([f, sf]) => undocumented(sf, used.get(f) ?? new Set()));
  assert.deepEqual(missing, []);
});

test('the rule itself: a line comment is not a doc comment, and a folder-private export needs none', () => {
  const lib = parse(
    'x/lib.ts',
    [
      '/** Shown on hover. */',
      'export function documented(): void {}',
      '// Not shown on hover.',
      'export function lineComment(): void {}',
      'export const bare = 1;',
      'export function privateToX(): void {}',
    ].join('\n'),
  );
  const sibling = parse('x/sibling.ts', "import { privateToX } from './lib.ts';");
  const user = parse('y/user.ts', "import { documented, lineComment, type bare } from '../x/lib.ts';");
  const used = importedAcrossFolders(
    new Map([
      ['x/lib.ts', lib],
      ['x/sibling.ts', sibling],
      ['y/user.ts', user],
    ]),
  );
  assert.deepEqual(undocumented(lib, used.get('x/lib.ts') ?? new Set()), ['x/lib.ts: lineComment', 'x/lib.ts: bare']);
  const loader = parse('y/loader.ts', "await import('../x/lib.ts');");
  const all = importedAcrossFolders(new Map([['y/loader.ts', loader]]));
  assert.equal(undocumented(lib, all.get('x/lib.ts') ?? new Set()).length, 3);
});
