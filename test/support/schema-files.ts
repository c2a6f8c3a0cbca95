// Imported for its effect: this test process reads cloud-init's schema
// files as src/main.ts and the render worker do.
import { installSchemaFiles } from '../../src/cloudinit/schema/schema-store.ts';
import { readTextFileBounded } from '../../src/core/bounded-file.ts';

installSchemaFiles({ read: readTextFileBounded });
