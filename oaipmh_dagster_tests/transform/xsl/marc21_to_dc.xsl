<?xml version="1.0" encoding="UTF-8"?>
<!-- MARCXML (MARC 21 slim, or without a namespace) to simple Dublin Core (oai_dc).
     Titles from 245 $a $b, creators from 100/110/700/710 $a, publisher and date from
     260/264 $b $c, subjects from 6XX $a, descriptions from 520 $a, identifiers from
     020 $a, 022 $a, 024 $a and 856 $u, language from 008/35-37. -->
<xsl:stylesheet version="1.0"
    xmlns:xsl="http://www.w3.org/1999/XSL/Transform"
    xmlns:oai_dc="http://www.openarchives.org/OAI/2.0/oai_dc/"
    xmlns:dc="http://purl.org/dc/elements/1.1/"
    exclude-result-prefixes="">
  <xsl:import href="marc_common.xsl"/>
  <xsl:output method="xml" indent="no"/>

  <xsl:template match="/">
    <xsl:apply-templates select="(/*[local-name()='record'] | /*/*[local-name()='record'])[1]"/>
  </xsl:template>

  <xsl:template match="*[local-name()='record']">
    <oai_dc:dc>
      <xsl:for-each select="*[local-name()='datafield'][@tag='245'][1]">
        <dc:title>
          <xsl:call-template name="trim-isbd">
            <xsl:with-param name="value">
              <xsl:value-of select="normalize-space(*[local-name()='subfield'][@code='a'][1])"/>
              <xsl:if test="*[local-name()='subfield'][@code='b']">
                <xsl:text> </xsl:text>
                <xsl:value-of select="normalize-space(*[local-name()='subfield'][@code='b'][1])"/>
              </xsl:if>
            </xsl:with-param>
          </xsl:call-template>
        </dc:title>
      </xsl:for-each>
      <xsl:for-each select="*[local-name()='datafield'][@tag='100' or @tag='110' or @tag='700' or @tag='710']/*[local-name()='subfield'][@code='a']">
        <dc:creator>
          <xsl:call-template name="trim-isbd">
            <xsl:with-param name="value" select="normalize-space()"/>
          </xsl:call-template>
        </dc:creator>
      </xsl:for-each>
      <xsl:for-each select="*[local-name()='datafield'][starts-with(@tag, '6')]/*[local-name()='subfield'][@code='a']">
        <dc:subject><xsl:value-of select="normalize-space()"/></dc:subject>
      </xsl:for-each>
      <xsl:for-each select="*[local-name()='datafield'][@tag='520']/*[local-name()='subfield'][@code='a']">
        <dc:description><xsl:value-of select="normalize-space()"/></dc:description>
      </xsl:for-each>
      <xsl:for-each select="*[local-name()='datafield'][@tag='260' or @tag='264']/*[local-name()='subfield'][@code='b']">
        <dc:publisher>
          <xsl:call-template name="trim-isbd">
            <xsl:with-param name="value" select="normalize-space()"/>
          </xsl:call-template>
        </dc:publisher>
      </xsl:for-each>
      <xsl:for-each select="*[local-name()='datafield'][@tag='260' or @tag='264']/*[local-name()='subfield'][@code='c']">
        <dc:date>
          <xsl:call-template name="trim-isbd">
            <xsl:with-param name="value" select="normalize-space()"/>
          </xsl:call-template>
        </dc:date>
      </xsl:for-each>
      <xsl:for-each select="*[local-name()='datafield'][@tag='020' or @tag='022' or @tag='024']/*[local-name()='subfield'][@code='a'] | *[local-name()='datafield'][@tag='856']/*[local-name()='subfield'][@code='u']">
        <dc:identifier><xsl:value-of select="normalize-space()"/></dc:identifier>
      </xsl:for-each>
      <xsl:variable name="lang" select="normalize-space(substring(*[local-name()='controlfield'][@tag='008'], 36, 3))"/>
      <xsl:if test="string-length($lang) = 3">
        <dc:language><xsl:value-of select="$lang"/></dc:language>
      </xsl:if>
    </oai_dc:dc>
  </xsl:template>
</xsl:stylesheet>
