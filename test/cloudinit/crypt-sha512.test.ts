// SHA-512 crypt against Drepper's published test vectors and, for random
// passwords and salts, against glibc's crypt through Python (one process)
// and openssl passwd -6.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fc from 'fast-check';
import { isValidSalt, sha512Crypt } from '../../src/cloudinit/crypt-sha512.ts';
import { deriveSalt } from '../../src/cloudinit/init/password-salt.ts';

// https://www.akkadia.org/drepper/SHA-crypt.txt, "Test vectors" for SHA-512.
const VECTORS: Array<[string, string, number | undefined, string]> = [
  [
    'saltstring',
    'Hello world!',
    undefined,
    '$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1',
  ],
  [
    'saltstringsaltstring',
    'Hello world!',
    10000,
    '$6$rounds=10000$saltstringsaltst$OW1/O6BYHV6BcXZu8QVeXbDWra3Oeqh0sbHbbMCVNSnCM/UrjmM0Dp8vOuZeHBy/YTBmSK6H9qs/y3RnOaw5v.',
  ],
  [
    'toolongsaltstring',
    'This is just a test',
    5000,
    '$6$rounds=5000$toolongsaltstrin$lQ8jolhgVRVhY4b5pZKaysCLi0QBxGoNeKQzQ3glMhwllF7oGDZxUhx1yxdYcz/e1JSbq3y6JMxxl8audkUEm0',
  ],
  [
    'roundstoolow',
    'the minimum number is still observed',
    10,
    '$6$rounds=1000$roundstoolow$kUMsbe306n21p9R.FRkW3IGn.S9NPN0x50YhH1xhLsPuWGsUSklZt58jaTfF4ZEQpyUNGc0dqbpBYYBaHHrsX.',
  ],
];

test("Drepper's SHA-512 test vectors", () => {
  for (const [salt, key, rounds, want] of VECTORS) {
    // Salts over 16 characters are cut, as the spec says; callers pass at most 16.
    const hash = sha512Crypt(key, salt.slice(0, 16), rounds);
    // The spec prints rounds=5000 when given explicitly; glibc omits the default.
    assert.equal(hash.replace('$6$rounds=5000$', '$6$'), want.replace('$6$rounds=5000$', '$6$'), `${salt}/${rounds}`);
  }
});

test('random passwords and salts agree with Python crypt and openssl passwd -6', () => {
  const alphabet = './0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
  const samples = fc.sample(
    fc.record({
      // No NUL or newline: crypt(3) stops at NUL and openssl reads a line.
      password: fc.string({ unit: fc.constantFrom(...'aZ9 !$\\\'"ü€\t~;-'.split('')), minLength: 0, maxLength: 130 }),
      salt: fc.string({ unit: fc.constantFrom(...alphabet.split('')), minLength: 1, maxLength: 16 }),
    }),
    { numRuns: 40, seed: 7 },
  );
  const hashes = samples.map((s) => sha512Crypt(s.password, s.salt));
  const py = spawnSync(
    '/usr/bin/python3',
    [
      '-W',
      'ignore',
      '-c',
      'import crypt,json,sys\nfor s in json.load(sys.stdin): print(crypt.crypt(s["password"], "$6$" + s["salt"]))',
    ],
    { input: JSON.stringify(samples), encoding: 'utf8' },
  );
  assert.equal(py.status, 0, py.stderr);
  assert.deepEqual(py.stdout.trim().split('\n'), hashes);
  // openssl reads one line and prints <NULL> for an empty one.
  for (const [i, s] of samples.entries()) {
    if (s.password === '' || i > 12) continue;
    const o = spawnSync('openssl', ['passwd', '-6', '-salt', s.salt, '-stdin'], {
      input: `${s.password}\n`,
      encoding: 'utf8',
    });
    assert.equal(o.stdout.trim(), hashes[i]);
  }
});

test('salts: invalid ones are refused; derived ones are stable, valid and per VMI and user', () => {
  assert.throws(() => sha512Crypt('x', ''), TypeError);
  assert.throws(() => sha512Crypt('x', 'bad$salt'), TypeError);
  assert.equal(isValidSalt('abcdefghijklmnopq'), false);
  const a = deriveSalt({ vmiUid: 'uid-1', user: 'ops' });
  assert.equal(a, deriveSalt({ vmiUid: 'uid-1', user: 'ops' }));
  assert.ok(isValidSalt(a) && a.length === 16);
  assert.notEqual(a, deriveSalt({ vmiUid: 'uid-2', user: 'ops' }));
  assert.notEqual(a, deriveSalt({ vmiUid: 'uid-1', user: 'root' }));
});
