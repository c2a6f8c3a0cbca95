// The hostile launcher's side of the socket-swap tests: a Node script, run
// in the launcher's libvirt-runtime directory (its cwd), that swaps
// `virtqemud-sock` between the launcher's own socket (kept as `.real-sock`)
// and a symlink to `target`, with renames so the name is never missing,
// until `seconds` have passed.
export function swapLoopScript(target: string, seconds: number): string {
  return `
      const fs = require('node:fs');
      const [real, sock, target] = ['.real-sock', 'virtqemud-sock', ${JSON.stringify(target)}];
      const end = Date.now() + ${seconds * 1000};
      while (Date.now() < end) {
        try {
          fs.linkSync(real, sock + '.a'); fs.renameSync(sock + '.a', sock);
          fs.symlinkSync(target, sock + '.b'); fs.renameSync(sock + '.b', sock);
        } catch { try { fs.unlinkSync(sock + '.a'); } catch {} try { fs.unlinkSync(sock + '.b'); } catch {} }
      }`;
}
