/** The SDK's release (package.json's version). */
export const VERSION = "0.2.0";
