// HTML escaping for the pure HTML renderers. Everything that reaches the
// page goes through esc(): names, messages and config values are written by
// users or derived from their objects.

const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&#39;',
};

export function esc(value: unknown): string {
  return String(value ?? '').replace(/[&<>"']/g, (c) => ESCAPES[c]);
}
