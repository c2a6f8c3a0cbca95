// Headless Debian chromium through playwright-core, with a fresh profile
// directory so runs never share state.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';

export const CHROMIUM = process.env.VMSEED_CHROMIUM ?? '/usr/bin/chromium';

export async function launchBrowser(): Promise<{ context: BrowserContext; close(): Promise<void> }> {
  const userDataDir = await mkdtemp(join(tmpdir(), 'vmseed-chromium-'));
  const context = await chromium.launchPersistentContext(userDataDir, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless',
      '--no-sandbox',
      '--disable-gpu',
      '--disable-quic',
      '--no-first-run',
      '--disable-background-networking',
      '--disable-component-update',
      '--disable-sync',
    ],
    viewport: { width: 1500, height: 900 },
  });
  return {
    context,
    async close() {
      await context.close();
      await rm(userDataDir, { recursive: true, force: true });
    },
  };
}
