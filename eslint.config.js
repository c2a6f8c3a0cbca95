// Type-aware lint of the whole tree. Formatting is Prettier's alone, so no
// stylistic rule here.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['node_modules/', 'var/', '.cache/', 'test-artifacts/'] },
  js.configs.recommended,
  ...tseslint.configs.recommendedTypeChecked,
  {
    linterOptions: { reportUnusedDisableDirectives: 'error' },
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': [
        'error',
        {
          // node:test runs and awaits the promises test() and describe() return.
          allowForKnownSafeCalls: [
            { from: 'package', package: 'node:test', name: ['test', 'it', 'describe', 'suite', 'before', 'after'] },
          ],
        },
      ],
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' },
      ],
      // A variable read in a callback before its one assignment stays let:
      // as a const the callback would meet it in its temporal dead zone.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
      '@typescript-eslint/consistent-type-imports': ['error', { fixStyle: 'inline-type-imports' }],
      // Methods that implement a Promise-returning interface are async so
      // that a throw becomes a rejection, with or without an await inside.
      '@typescript-eslint/require-await': 'off',
      // Open Kubernetes string fields are typed as their known values | string
      // on purpose: the union documents what KubeVirt sets.
      '@typescript-eslint/no-redundant-type-constituents': 'off',
      // A rejection passes on what was caught, as it was caught.
      '@typescript-eslint/prefer-promise-reject-errors': ['error', { allowThrowingUnknown: true }],
      // Input validation matches control characters on purpose.
      'no-control-regex': 'off',
      // Parsed YAML/JSON scalars are validated as String(value): an object
      // becomes '[object Object]' and fails the check that follows.
      '@typescript-eslint/no-base-to-string': 'off',
    },
  },
  {
    // Tests and benchmarks read untyped JSON (status pages, metrics, fixtures)
    // and assert on its shape: `any` there is the point, not a leak.
    files: ['test/**', 'e2e/**', 'bench/**'],
    rules: {
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      '@typescript-eslint/no-explicit-any': 'off',
      '@typescript-eslint/unbound-method': 'off',
      '@typescript-eslint/require-await': 'off',
    },
  },
  { files: ['**/*.js'], ...tseslint.configs.disableTypeChecked },
);
